//! Test harness: each test starts its own server (free port, the freshly built module, a
//! temp dir) and stops it on drop. Never depends on a server already running. The binary is
//! `$REDIS_SERVER` (default `redis-server`; `make test` also runs everything on `valkey-server`).
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use redis::Value;

pub mod cluster;

/// The server binary every test starts: `$REDIS_SERVER` (e.g. `valkey-server`), else
/// `redis-server`. `make test` runs the integration suite once with each.
pub fn server_bin() -> String {
    std::env::var("REDIS_SERVER")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".into())
}

/// The matching command-line client: `$REDIS_CLI`, else the server's name with `-server`
/// replaced by `-cli` (`valkey-server` -> `valkey-cli`).
pub fn cli_bin() -> String {
    if let Some(c) = std::env::var("REDIS_CLI").ok().filter(|s| !s.is_empty()) {
        return c;
    }
    let server = server_bin();
    match server.strip_suffix("-server") {
        Some(stem) => format!("{stem}-cli"),
        None => "redis-cli".into(),
    }
}

/// Path of the module under test: `$QUOTA_MODULE`, else the debug build.
pub fn module_path() -> PathBuf {
    if let Ok(p) = std::env::var("QUOTA_MODULE") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/debug/libredis_quota.so")
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().unwrap().port()
}

/// Every port (and bus port) handed out to a cluster node by this test process.
static CLUSTER_PORTS: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A free port whose cluster bus port (port + 10000) is free too, and neither handed out to
/// a cluster node before in this process: the nodes of a cluster keep trying a killed node's
/// address, and would meet (and merge with) another cluster's node started on it.
fn free_cluster_port() -> u16 {
    let mut used = CLUSTER_PORTS.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..1000 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().unwrap().port();
        if port > 55535 || used.contains(&port) || used.contains(&(port + 10000)) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            used.insert(port);
            used.insert(port + 10000);
            return port;
        }
    }
    panic!("no free port pair (port, port + 10000)");
}

static SEQ: AtomicU32 = AtomicU32::new(0);

fn temp_dir() -> PathBuf {
    let n = SEQ.fetch_add(1, Ordering::SeqCst);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let dir = std::env::temp_dir().join(format!("rq-test-{}-{n}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A server (`server_bin()`) with the module loaded, killed and cleaned up on drop.
pub struct Server {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
    args: Vec<String>,
    module_args: Vec<String>,
}

impl Server {
    /// Starts a server with extra config `args` (e.g. `["--appendonly", "yes"]`).
    pub fn start(args: &[&str]) -> Server {
        Server::start_with_module_args(args, &[])
    }

    /// Starts a server passing `module_args` after the module path (`loadmodule path k v ...`).
    pub fn start_with_module_args(args: &[&str], module_args: &[&str]) -> Server {
        Server::start_with_files(args, module_args, &[])
    }

    /// Starts a server whose data dir first receives `files` (name, contents), e.g. a golden
    /// `dump.rdb`.
    pub fn start_with_files(
        args: &[&str],
        module_args: &[&str],
        files: &[(&str, &[u8])],
    ) -> Server {
        let dir = temp_dir();
        for (name, bytes) in files {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        let mut s = Server {
            port: 0,
            dir,
            child: None,
            args: args.iter().map(|s| s.to_string()).collect(),
            module_args: module_args.iter().map(|s| s.to_string()).collect(),
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let cluster = self.args.iter().any(|a| a == "--cluster-enabled");
        for _attempt in 0..5 {
            self.port = if cluster {
                free_cluster_port()
            } else {
                free_port()
            };
            if self.launch() {
                return;
            }
            self.kill();
        }
        panic!("{} did not start; log:\n{}", server_bin(), self.log());
    }

    /// Starts the server on `self.port` and waits until it answers PING.
    fn launch(&mut self) -> bool {
        let mut cmd = Command::new(server_bin());
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--save")
            .arg("")
            .arg("--enable-debug-command")
            .arg("yes")
            .arg("--logfile")
            .arg(self.dir.join("redis.log"));
        let mut load = vec![module_path().display().to_string()];
        load.extend(self.module_args.iter().cloned());
        cmd.arg("--loadmodule").args(&load);
        cmd.args(&self.args);
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {} ({e}): make deps", server_bin()));
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> bool {
        // Generous: a busy 2-CPU machine may start a dozen servers at once (tests/cluster.rs).
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    return false;
                }
            }
            if let Ok(mut c) = self.try_conn() {
                let pong: redis::RedisResult<String> = redis::cmd("PING").query(&mut c);
                if pong.is_ok() {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn try_conn(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?.get_connection()
    }

    /// A RESP2 connection.
    pub fn conn(&self) -> redis::Connection {
        self.try_conn().expect("connect")
    }

    /// A RESP3 connection.
    pub fn conn3(&self) -> redis::Connection {
        redis::Client::open(format!("redis://127.0.0.1:{}/?protocol=resp3", self.port))
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// Makes this server a replica of `master` and waits until the link is up.
    pub fn replicate_from(&self, master: &Server) {
        let mut c = self.conn();
        ok(
            &mut c,
            &["REPLICAOF", "127.0.0.1", &master.port.to_string()],
        );
        wait_link_up(&mut c);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// Is the process still running?
    pub fn alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL, no cleanup of the data dir.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Restarts on the same port and dir with the same args (data reloads from RDB/AOF).
    pub fn restart(&mut self) {
        self.shutdown();
        self.kill_and_restart();
    }

    /// Starts again after a kill or shutdown, on the same port and dir.
    pub fn kill_and_restart(&mut self) {
        self.kill();
        // The port may linger for a moment after the old process exits.
        for _ in 0..100 {
            if TcpListener::bind(("127.0.0.1", self.port)).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(self.launch(), "restart failed; log:\n{}", self.log());
    }

    /// Graceful SHUTDOWN (NOSAVE: persistence must already be in the AOF), then wait.
    pub fn shutdown(&mut self) {
        if let Ok(mut c) = self.try_conn() {
            let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").arg("NOSAVE").query(&mut c);
        }
        if let Some(mut c) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs a command and returns the raw reply (errors as `Err`).
pub fn q(con: &mut redis::Connection, args: &[&str]) -> redis::RedisResult<Value> {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(con)
}

/// Runs a command that must succeed.
pub fn ok(con: &mut redis::Connection, args: &[&str]) -> Value {
    q(con, args).unwrap_or_else(|e| panic!("{args:?} failed: {e}"))
}

/// Runs a command that must fail; returns the error's code and full text.
pub fn err(con: &mut redis::Connection, args: &[&str]) -> (String, String) {
    match q(con, args) {
        Ok(v) => panic!("{args:?} should fail, got {v:?}"),
        Err(e) => (e.code().unwrap_or("").to_string(), e.to_string()),
    }
}

/// An integer reply.
pub fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        other => panic!("expected integer, got {other:?}"),
    }
}

/// A string reply (bulk or simple) as text.
pub fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".into(),
        other => panic!("expected string, got {other:?}"),
    }
}

/// An array reply's items.
pub fn items(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(a) => a.clone(),
        other => panic!("expected array, got {other:?}"),
    }
}

/// QUOTA.INFO as (field, integer) pairs; panics on nil.
pub fn info(con: &mut redis::Connection, key: &str) -> std::collections::BTreeMap<String, i64> {
    info_args(con, &["QUOTA.INFO", key])
}

/// QUOTA.INFO at a test-clock time.
pub fn info_at(
    con: &mut redis::Connection,
    key: &str,
    at: i64,
) -> std::collections::BTreeMap<String, i64> {
    info_args(con, &["QUOTA.INFO", key, "AT", &at.to_string()])
}

fn info_args(
    con: &mut redis::Connection,
    args: &[&str],
) -> std::collections::BTreeMap<String, i64> {
    let v = ok(con, args);
    let pairs: Vec<(Value, Value)> = match v {
        Value::Array(a) => a.chunks(2).map(|c| (c[0].clone(), c[1].clone())).collect(),
        Value::Map(m) => m,
        other => panic!("expected map, got {other:?}"),
    };
    pairs
        .into_iter()
        .filter_map(|(k, v)| match v {
            Value::Int(n) => Some((text(&k), n)),
            _ => None,
        })
        .collect()
}

/// DEBUG DIGEST-VALUE of one key.
pub fn digest(con: &mut redis::Connection, key: &str) -> String {
    let v = ok(con, &["DEBUG", "DIGEST-VALUE", key]);
    match v {
        Value::Array(a) => text(&a[0]),
        other => text(&other),
    }
}

/// All keys, sorted.
pub fn keys(con: &mut redis::Connection) -> Vec<String> {
    let mut k: Vec<String> = redis::cmd("KEYS").arg("*").query(con).unwrap();
    k.sort();
    k
}

/// Server arguments for AOF tests: every write synced at once, the AOF in plain commands (no
/// RDB preamble), so [`incr_aof`] reads the replicated lines as they were written.
pub const PLAIN_AOF: [&str; 6] = [
    "--appendonly",
    "yes",
    "--appendfsync",
    "always",
    "--aof-use-rdb-preamble",
    "no",
];

/// Every `*.incr.aof` in the server's AOF directory, concatenated.
pub fn incr_aof(s: &Server) -> Vec<u8> {
    let mut out = Vec::new();
    let dir = s.dir.join("appendonlydir");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for f in files {
        if f.to_string_lossy().ends_with(".incr.aof") {
            out.extend(std::fs::read(f).unwrap());
        }
    }
    out
}

/// Digest of every key, for comparing two servers.
pub fn all_digests(con: &mut redis::Connection) -> Vec<(String, String)> {
    keys(con)
        .into_iter()
        .map(|k| {
            let d = digest(con, &k);
            (k, d)
        })
        .collect()
}

/// Waits (up to 10 s) until a replica's link to its master is up.
pub fn wait_link_up(replica: &mut redis::Connection) {
    for _ in 0..400 {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(replica)
            .unwrap();
        if info.contains("master_link_status:up") {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("replica link did not come up");
}

/// Runs `f` between WATCH key and MULTI/EXEC: true if the transaction still ran, i.e. `f`
/// did not touch (signal as modified) the key.
pub fn untouched(
    c: &mut redis::Connection,
    key: &str,
    f: impl FnOnce(&mut redis::Connection),
) -> bool {
    ok(c, &["WATCH", key]);
    f(c);
    ok(c, &["MULTI"]);
    ok(c, &["PING"]);
    ok(c, &["EXEC"]) != Value::Nil
}

/// `INFO <section>` as integer fields.
pub fn info_section(
    c: &mut redis::Connection,
    section: &str,
) -> std::collections::BTreeMap<String, i64> {
    let s: String = redis::cmd("INFO").arg(section).query(c).unwrap();
    s.lines()
        .filter_map(|l| l.trim().split_once(':'))
        .filter_map(|(k, v)| v.parse().ok().map(|v| (k.to_string(), v)))
        .collect()
}

/// `INFO memory`'s `used_memory` (bytes).
pub fn used_memory(c: &mut redis::Connection) -> i64 {
    info_section(c, "memory")["used_memory"]
}

/// `used_memory` once it stands still (two equal readings, at most 10 tries): a new
/// connection's first commands grow its buffers, which would move a measurement.
pub fn settled_used_memory(c: &mut redis::Connection) -> i64 {
    let mut last = used_memory(c);
    for _ in 0..10 {
        let now = used_memory(c);
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// The arguments of a command written as one line (split on white space; none may be empty or
/// hold a space).
pub fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// [`ok`] for a command written as one line ([`words`]).
pub fn ok_line(con: &mut redis::Connection, line: &str) -> Value {
    ok(con, &words(line))
}

/// [`err`] for a command written as one line ([`words`]).
pub fn err_line(con: &mut redis::Connection, line: &str) -> (String, String) {
    err(con, &words(line))
}
