//! The server a benchmark phase runs against (examples/common/server.rs: a free port, the module,
//! no persistence, a temp dir; killed and removed on drop), plus `INFO` parsing helpers and CPU
//! pinning.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Result;

#[path = "../examples/common/server.rs"]
mod spawn;
pub use spawn::{module_path, Server};

/// `$QUOTA_FLOOR_MODULE`, else `target/release/examples/libapifloor.so` (bench/floor.rs, built
/// by `make bench`); `None` if it is not there (the floor rows then say "not run").
pub fn floor_module_path() -> Option<PathBuf> {
    let path = match std::env::var_os("QUOTA_FLOOR_MODULE") {
        Some(p) => PathBuf::from(p),
        None => {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/examples/libapifloor.so")
        }
    };
    std::fs::canonicalize(path).ok()
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
        Server::spawn(&format!("bench-{tag}"), module, module_args, extra)
    }

    pub fn connection(&self) -> Result<redis::Connection> {
        Ok(self.client()?.get_connection()?)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
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
