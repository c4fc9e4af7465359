//! The server (`$REDIS_SERVER`, default redis-server) a benchmark phase runs against: started on a free port with the module,
//! no persistence, a temp dir; killed and removed on drop. Plus `INFO` parsing helpers.

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Result;

/// The server binary: `$REDIS_SERVER` (e.g. `valkey-server`), else `redis-server`.
pub fn server_bin() -> String {
    std::env::var("REDIS_SERVER")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".into())
}

/// `$QUOTA_MODULE`, else the release build, as an absolute path (redis-server changes directory
/// to `--dir` before loading modules).
pub fn module_path() -> Result<PathBuf> {
    let path = match std::env::var_os("QUOTA_MODULE") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/libredis_quota.so"),
    };
    std::fs::canonicalize(&path).map_err(|e| {
        format!(
            "module not found at {} ({e}): run `make bench` (it builds the release module), \
             or set QUOTA_MODULE",
            path.display()
        )
        .into()
    })
}

/// `$QUOTA_FLOOR_MODULE`, else `target/release/examples/libapifloor.so` (bench/floor.rs, built
/// by `make bench`); `None` if it is not there (the floor row is then left out).
pub fn floor_module_path() -> Option<PathBuf> {
    let path = match std::env::var_os("QUOTA_FLOOR_MODULE") {
        Some(p) => PathBuf::from(p),
        None => {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/examples/libapifloor.so")
        }
    };
    std::fs::canonicalize(path).ok()
}

pub struct Server {
    pub port: u16,
    dir: PathBuf,
    child: Child,
}

impl Server {
    /// Starts a server; `module_args` go after the module path (`name value ...` configs).
    pub fn start(module: &Path, tag: &str, module_args: &[&str]) -> Result<Server> {
        Server::start_with(module, None, tag, module_args)
    }

    /// [`Server::start`], also loading `extra` (a second module, without arguments).
    pub fn start_with(
        module: &Path,
        extra: Option<&Path>,
        tag: &str,
        module_args: &[&str],
    ) -> Result<Server> {
        let dir =
            std::env::temp_dir().join(format!("redis-quota-bench-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("cannot find a free port: {e}"))?
            .port();
        let mut load = vec![module.display().to_string()];
        load.extend(module_args.iter().map(|s| s.to_string()));
        let mut cmd = Command::new(server_bin());
        if let Some(extra) = extra {
            cmd.arg("--loadmodule").arg(extra);
        }
        let child = cmd
            .arg("--port")
            .arg(port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .arg("--loadmodule")
            .args(&load)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot run {} ({e}): install it with `make deps`",
                    server_bin()
                )
            })?;
        let mut server = Server { port, dir, child };
        server.wait_ready()?;
        Ok(server)
    }

    pub fn client(&self) -> Result<redis::Client> {
        Ok(redis::Client::open(format!(
            "redis://127.0.0.1:{}/",
            self.port
        ))?)
    }

    pub fn connection(&self) -> Result<redis::Connection> {
        Ok(self.client()?.get_connection()?)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let client = self.client()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "{} exited at startup ({status}); its log:\n{}",
                    server_bin(),
                    self.log()
                )
                .into());
            }
            if let Ok(mut con) = client.get_connection() {
                if redis::cmd("PING").query::<String>(&mut con).is_ok() {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!(
            "{} did not answer on port {} within 10 s; its log:\n{}",
            server_bin(),
            self.port,
            self.log()
        )
        .into())
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log"))
            .unwrap_or_else(|e| format!("(no log: {e})"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `INFO section` as `field → value` (comments and section headers dropped).
pub fn info(con: &mut redis::Connection, section: &str) -> Result<HashMap<String, String>> {
    let text: String = redis::cmd("INFO").arg(section).query(con)?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect())
}

/// An integer field of `INFO section`.
pub fn info_i64(con: &mut redis::Connection, section: &str, field: &str) -> Result<i64> {
    let map = info(con, section)?;
    map.get(field)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("INFO {section} has no integer field {field}").into())
}

/// `used_memory` in bytes.
pub fn used_memory(con: &mut redis::Connection) -> Result<i64> {
    info_i64(con, "memory", "used_memory")
}

/// Calls and total µs of one command from `INFO commandstats` (0, 0 if never called).
pub fn command_stats(con: &mut redis::Connection, name: &str) -> Result<(u64, u64)> {
    let map = info(con, "commandstats")?;
    // Module commands keep the case they were registered with.
    let field = format!("cmdstat_{name}");
    let Some(line) = map
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(&field))
        .map(|(_, v)| v)
    else {
        return Ok((0, 0));
    };
    let mut calls = 0;
    let mut usec = 0;
    for part in line.split(',') {
        match part.split_once('=') {
            Some(("calls", v)) => calls = v.parse()?,
            Some(("usec", v)) => usec = v.parse()?,
            _ => {}
        }
    }
    Ok((calls, usec))
}

/// The redis-server version string.
pub fn redis_version(con: &mut redis::Connection) -> Result<String> {
    let map = info(con, "server")?;
    Ok(map
        .get("redis_version")
        .cloned()
        .unwrap_or_else(|| "?".into()))
}

/// The server on a CPU of its own and this process (the client threads it starts from now on)
/// on the others, for as long as the value lives; both get their former CPUs back on drop.
/// This is how throughput is measured when clients run on other hosts, as a gateway's do: on a
/// shared machine the client threads otherwise take CPU time from the server (Redis's own
/// benchmark notes: with client and server on one box, the CPU is the limiting factor).
/// Uses `taskset` (util-linux); needs at least 2 CPUs.
pub struct Pinned {
    server: u32,
    former: String,
    /// How many CPUs the clients have.
    pub client_cpus: usize,
}

impl Pinned {
    pub fn new(server: &Server) -> Result<Pinned> {
        let me = std::process::id();
        let former = affinity(me)?;
        let cpus = parse_cpu_list(&former)
            .ok_or_else(|| format!("cannot read the CPU list {former:?}"))?;
        let [first, rest @ ..] = cpus.as_slice() else {
            return Err("no CPU to run on".into());
        };
        if rest.is_empty() {
            return Err("needs 2 CPUs".into());
        }
        let rest: Vec<String> = rest.iter().map(|c| c.to_string()).collect();
        taskset(&first.to_string(), server.pid(), false)?;
        let pinned = Pinned {
            server: server.pid(),
            former,
            client_cpus: rest.len(),
        };
        taskset(&rest.join(","), me, true)?;
        Ok(pinned)
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = taskset(&self.former, self.server, false);
        let _ = taskset(&self.former, std::process::id(), true);
    }
}

/// `taskset -p -c cpus pid`: the main thread of `pid` (with `all`, every thread) onto `cpus`.
fn taskset(cpus: &str, pid: u32, all: bool) -> Result<()> {
    let out = Command::new("taskset")
        .args(if all { &["-a"][..] } else { &[] })
        .args(["-p", "-c", cpus, &pid.to_string()])
        .output()
        .map_err(|e| format!("cannot run taskset ({e})"))?;
    if !out.status.success() {
        return Err(format!(
            "taskset -c {cpus} {pid}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(())
}

/// The CPU list `pid` may run on, as `taskset -p -c` prints it (`0-3,5`).
fn affinity(pid: u32) -> Result<String> {
    let out = Command::new("taskset")
        .args(["-p", "-c", &pid.to_string()])
        .output()
        .map_err(|e| format!("cannot run taskset ({e})"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.rsplit_once(':')
        .map(|(_, list)| list.trim().to_string())
        .filter(|list| out.status.success() && !list.is_empty())
        .ok_or_else(|| format!("taskset -p {pid}: unexpected output {text:?}").into())
}

/// `0-3,5` → [0, 1, 2, 3, 5].
fn parse_cpu_list(list: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.trim().parse::<usize>().ok()?..=b.trim().parse().ok()?),
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    Some(cpus)
}
