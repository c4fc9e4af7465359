//! A redis-server (`$REDIS_SERVER`, default redis-server) started for one run of an example: a
//! free port, no persistence, a temp dir, the module loaded; killed and its dir removed on drop.
//! Shared by the bench (bench/server.rs) and the demo replay (examples/replay), which include
//! this file with `#[path]` (each is an example crate of its own).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::Result;

/// The server binary: `$REDIS_SERVER` (e.g. `valkey-server`), else `redis-server`.
pub fn server_bin() -> String {
    std::env::var("REDIS_SERVER")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".into())
}

/// `$QUOTA_MODULE`, else the release build, as an absolute path (redis-server changes directory
/// to `--dir` before loading modules). `how` says how to build it when it is missing.
pub fn module_path(how: &str) -> Result<PathBuf> {
    let path = match std::env::var_os("QUOTA_MODULE") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/libredis_quota.so"),
    };
    std::fs::canonicalize(&path).map_err(|e| {
        format!(
            "module not found at {} ({e}): {how}, or set QUOTA_MODULE",
            path.display()
        )
        .into()
    })
}

pub struct Server {
    pub port: u16,
    dir: PathBuf,
    // pub(super): the including module adds its own methods (the bench's `pid`).
    pub(super) child: Child,
}

impl Server {
    /// Starts a server in the temp dir `redis-quota-<name>-<pid>`, loading `extra` (a second
    /// module, without arguments) if given, then `module` with `module_args` (`name value ...`
    /// configs); returns once it answers PING (10 s at most).
    pub fn spawn(
        name: &str,
        module: &Path,
        module_args: &[&str],
        extra: Option<&Path>,
    ) -> Result<Server> {
        let dir = std::env::temp_dir().join(format!("redis-quota-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("cannot find a free port: {e}"))?
            .port();
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
            .arg(module)
            .args(module_args)
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
