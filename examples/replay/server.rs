//! The replay's own redis-server (when no `REDIS_URL` is given): a free port, no persistence, a
//! temporary directory, the module loaded; stopped when dropped.

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
/// to `--dir` before loading modules).
pub fn module_path() -> Result<PathBuf> {
    let path = match std::env::var_os("QUOTA_MODULE") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/libredis_quota.so"),
    };
    std::fs::canonicalize(&path).map_err(|e| {
        format!(
            "module not found at {} ({e}): build it with `cargo build --release` \
             (or run `make demo`), or set QUOTA_MODULE",
            path.display()
        )
        .into()
    })
}

/// A redis-server started for this run; killed and its temp dir removed on drop.
pub struct Server {
    pub port: u16,
    pub module: PathBuf,
    dir: PathBuf,
    child: Child,
}

impl Server {
    pub fn start(module: &Path) -> Result<Server> {
        let dir = std::env::temp_dir().join(format!("redis-quota-replay-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("cannot find a free port: {e}"))?
            .port();
        let child = Command::new(server_bin())
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
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot run {} ({e}): install it with `make deps`",
                    server_bin()
                )
            })?;
        let mut server = Server {
            port,
            module: module.to_path_buf(),
            dir,
            child,
        };
        server.wait_ready()?;
        Ok(server)
    }

    /// Waits until the server answers PING (10 s at most).
    fn wait_ready(&mut self) -> Result<()> {
        let url = format!("redis://127.0.0.1:{}/", self.port);
        let client = redis::Client::open(url.as_str())?;
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
