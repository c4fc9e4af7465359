//! `make soak`: a long mixed workload against a master with a replica and an AOF, checking that
//! nothing diverges, leaks or breaks. Not part of CI (it runs for minutes).
//!
//! # Setup
//!
//! Starts its own servers (free ports, temp dirs, `QUOTA_MODULE` or the release build):
//! - a master with `appendonly yes`, `appendfsync everysec`, the RDB preamble in rewrites, and
//!   `quota.finished-ttl 5000` (finished ids are forgotten while it runs);
//! - a replica of it.
//!
//! # Workload (`SOAK_THREADS` connections, default 8, until `SOAK_MINUTES`, default 10)
//!
//! Each thread loops over 200 budgets and 100 windows: RESERVE with short TTLs (20 ms to 3 s, so
//! reservations expire and the sweeper releases them), SETTLE, ROLLBACK and EXTEND of its own
//! ids, CHARGE (with and without ids), QUOTA.WINDOW with several windows and costs, reads
//! (INFO, PENDING), QUOTA.SET (limits change, some budgets get a one-minute period so resets
//! happen), and key churn: short key TTLs (PEXPIRE) and DEL, after which budgets are created
//! again. Error replies other than NOQUOTA / NORESERVATION / CONFLICT count as failures.
//!
//! # Checks (every `SOAK_CHECK_SECONDS`, default 15)
//!
//! - BGREWRITEAOF and BGSAVE alternate between checks.
//! - Under `CLIENT PAUSE WRITE` on the master (which also stops the master's active expiry and
//!   the module's sweeper: nothing writes), after `WAIT 1`: `DEBUG DIGEST` of master and replica
//!   must be equal (on a mismatch the keys that differ are listed), and 30 random budgets must
//!   pass the ledger invariants (`available = limit - used - reserved`, `reserved` = the sum of
//!   PENDING, `pending` = its count).
//! - Memory (`used_memory` of both), keys and module counters are sampled.
//!
//! At the end: a last digest check, every budget checked, then (still paused) the master reloads
//! its AOF from disk (`DEBUG LOADAOF`: the base rewritten many times by then, plus the
//! incremental files) and every key that does not expire within a minute must have the same
//! digest as before.
//!
//! Prints a summary (operations by command, errors, digests compared, latency, memory over time)
//! and exits with status 1 on any divergence, invariant failure, unexpected error or dead server.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::Value;

const BUDGETS: usize = 200;
const WINDOWS: usize = 100;
const ALLOWED_CODES: [&str; 3] = ["NOQUOTA", "NORESERVATION", "CONFLICT"];

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("soak: FAILED");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("soak: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// Servers.
// ---------------------------------------------------------------------------------------------

/// The server binary: `$REDIS_SERVER` (e.g. `valkey-server`), else `redis-server`.
fn server_bin() -> String {
    std::env::var("REDIS_SERVER")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".into())
}

fn module_path() -> Result<PathBuf, String> {
    let path = match std::env::var_os("QUOTA_MODULE") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/libredis_quota.so"),
    };
    std::fs::canonicalize(&path).map_err(|e| {
        format!(
            "module not found at {} ({e}): run `make soak` or set QUOTA_MODULE",
            path.display()
        )
    })
}

struct Server {
    name: &'static str,
    port: u16,
    dir: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

impl Server {
    fn start(name: &'static str, module: &Path, extra: &[&str], module_args: &[&str]) -> Server {
        let dir =
            std::env::temp_dir().join(format!("redis-quota-soak-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            &dir.display().to_string(),
            "--save",
            "",
            "--enable-debug-command",
            "yes",
            "--logfile",
            &dir.join("redis.log").display().to_string(),
            "--loadmodule",
            &module.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(module_args.iter().map(|s| s.to_string()));
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut s = Server {
            name,
            port,
            dir,
            args,
            child: None,
        };
        s.launch();
        s
    }

    fn launch(&mut self) {
        let child = Command::new(server_bin())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {} ({e}): make deps", server_bin()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(mut c) = self.try_conn() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("{} did not start; log:\n{}", self.name, self.log());
    }

    fn try_conn(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?.get_connection()
    }

    fn conn(&self) -> redis::Connection {
        self.try_conn().expect("connect")
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn info_field(c: &mut redis::Connection, section: &str, field: &str) -> i64 {
    let text: String = redis::cmd("INFO").arg(section).query(c).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1)
}

// ---------------------------------------------------------------------------------------------
// Workload.
// ---------------------------------------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Shared between the workers and the checker.
struct Shared {
    stop: AtomicBool,
    /// Set while the checker holds CLIENT PAUSE (those latencies are not the module's).
    paused: AtomicBool,
    pause_epoch: AtomicU64,
    stats: Mutex<Stats>,
}

#[derive(Default)]
struct Stats {
    ops: BTreeMap<&'static str, u64>,
    errors: BTreeMap<String, u64>,
    unexpected: Vec<String>,
    /// Latency histogram: bucket i counts ops that took [2^i, 2^(i+1)) µs.
    latency_us: [u64; 32],
    max_latency: Duration,
}

impl Stats {
    fn merge(&mut self, o: Stats) {
        for (k, v) in o.ops {
            *self.ops.entry(k).or_default() += v;
        }
        for (k, v) in o.errors {
            *self.errors.entry(k).or_default() += v;
        }
        self.unexpected.extend(o.unexpected);
        for (a, b) in self.latency_us.iter_mut().zip(o.latency_us) {
            *a += b;
        }
        self.max_latency = self.max_latency.max(o.max_latency);
    }

    fn percentile(&self, p: f64) -> Duration {
        let total: u64 = self.latency_us.iter().sum();
        let target = (total as f64 * p).ceil() as u64;
        let mut seen = 0;
        for (i, n) in self.latency_us.iter().enumerate() {
            seen += n;
            if seen >= target.max(1) {
                return Duration::from_micros(1 << (i + 1));
            }
        }
        Duration::ZERO
    }
}

fn budget(i: u64) -> String {
    format!("soak:b:{{{i}}}")
}

fn window(i: u64) -> String {
    format!("soak:w:{i}")
}

fn worker(port: u16, seed: u64, shared: Arc<Shared>) {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_connection()
        .unwrap();
    let mut rng = Rng(seed | 1);
    let mut stats = Stats::default();
    let mut mine: Vec<(u64, String)> = Vec::new();
    let mut n = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        n += 1;
        let b = rng.below(BUDGETS as u64);
        let key = budget(b);
        let mut cmd;
        let name: &'static str;
        let mut reserve_on = None;
        match rng.below(100) {
            0..=24 => {
                name = "RESERVE";
                cmd = redis::cmd("QUOTA.RESERVE");
                cmd.arg(&key)
                    .arg(rng.below(200))
                    .arg("TTL")
                    .arg(20 + rng.below(3_000));
                if rng.below(4) == 0 {
                    cmd.arg("ID").arg(format!("t{seed}-{n}"));
                }
                reserve_on = Some(b);
            }
            25..=44 if !mine.is_empty() => {
                name = "SETTLE";
                let (b, id) = mine.swap_remove((rng.next() % mine.len() as u64) as usize);
                cmd = redis::cmd("QUOTA.SETTLE");
                cmd.arg(budget(b)).arg(id).arg(rng.below(250));
            }
            45..=49 if !mine.is_empty() => {
                name = "ROLLBACK";
                let (b, id) = mine.swap_remove((rng.next() % mine.len() as u64) as usize);
                cmd = redis::cmd("QUOTA.ROLLBACK");
                cmd.arg(budget(b)).arg(id);
            }
            50..=52 if !mine.is_empty() => {
                name = "EXTEND";
                let (b, id) = mine[(rng.next() % mine.len() as u64) as usize].clone();
                cmd = redis::cmd("QUOTA.EXTEND");
                cmd.arg(budget(b)).arg(id).arg(50 + rng.below(2_000));
            }
            53..=66 => {
                name = "CHARGE";
                cmd = redis::cmd("QUOTA.CHARGE");
                cmd.arg(&key).arg(rng.below(100));
                if rng.below(3) == 0 {
                    cmd.arg("ID").arg(format!("k{seed}-{n}"));
                }
                if rng.below(5) == 0 {
                    cmd.arg("FORCE");
                }
            }
            67..=86 => {
                name = "WINDOW";
                let w = [1_000u64, 10_000, 60_000][rng.below(3) as usize];
                cmd = redis::cmd("QUOTA.WINDOW");
                cmd.arg(window(rng.below(WINDOWS as u64)))
                    .arg(50 + rng.below(200))
                    .arg(w)
                    .arg("COST")
                    .arg(1 + rng.below(5));
            }
            87..=89 => {
                name = "INFO";
                cmd = redis::cmd("QUOTA.INFO");
                cmd.arg(&key);
            }
            90..=91 => {
                name = "PENDING";
                cmd = redis::cmd("QUOTA.PENDING");
                cmd.arg(&key).arg("COUNT").arg(100);
            }
            92..=95 => {
                name = "SET";
                cmd = set_cmd(&key, &mut rng);
            }
            96..=97 => {
                name = "PEXPIRE";
                cmd = redis::cmd("PEXPIRE");
                let k = if rng.below(2) == 0 {
                    key.clone()
                } else {
                    window(rng.below(WINDOWS as u64))
                };
                cmd.arg(k).arg(100 + rng.below(2_000));
            }
            _ => {
                name = "DEL";
                cmd = redis::cmd("DEL");
                cmd.arg(&key);
            }
        }
        let was_paused = shared.paused.load(Ordering::SeqCst);
        let epoch = shared.pause_epoch.load(Ordering::SeqCst);
        let started = Instant::now();
        let reply = cmd.query::<Value>(&mut c);
        let took = started.elapsed();
        if !was_paused
            && !shared.paused.load(Ordering::SeqCst)
            && shared.pause_epoch.load(Ordering::SeqCst) == epoch
        {
            let us = took.as_micros().max(1) as u64;
            stats.latency_us[(63 - us.leading_zeros()).min(31) as usize] += 1;
            stats.max_latency = stats.max_latency.max(took);
        }
        *stats.ops.entry(name).or_default() += 1;
        match reply {
            Ok(Value::Array(a)) if reserve_on.is_some() => {
                if let Some(Value::BulkString(id)) = a.get(1) {
                    if mine.len() > 2_000 {
                        mine.swap_remove(0);
                    }
                    mine.push((
                        reserve_on.unwrap(),
                        String::from_utf8_lossy(id).into_owned(),
                    ));
                }
            }
            Ok(_) => {}
            Err(e) => match e.code() {
                Some("NOQUOTA") => {
                    *stats.errors.entry("NOQUOTA".into()).or_default() += 1;
                    let _ = set_cmd(&key, &mut rng).query::<Value>(&mut c);
                }
                Some(code) if ALLOWED_CODES.contains(&code) => {
                    *stats.errors.entry(code.to_string()).or_default() += 1;
                }
                _ => {
                    *stats.errors.entry("unexpected".into()).or_default() += 1;
                    if stats.unexpected.len() < 20 {
                        stats.unexpected.push(format!("{name}: {e}"));
                    }
                    if e.code().is_none() {
                        // The connection broke: the server is gone, the checker will see it.
                        break;
                    }
                }
            },
        }
    }
    shared.stats.lock().unwrap().merge(stats);
}

/// QUOTA.SET with a random limit; a quarter of the budgets reset every minute.
fn set_cmd(key: &str, rng: &mut Rng) -> redis::Cmd {
    let mut cmd = redis::cmd("QUOTA.SET");
    cmd.arg(key)
        .arg("LIMIT")
        .arg(5_000 + rng.below(100_000))
        .arg("OVERDRAFT")
        .arg(rng.below(100));
    if key.bytes().map(u64::from).sum::<u64>() % 4 == 0 {
        cmd.arg("PERIOD").arg("MINUTE");
    }
    cmd
}

// ---------------------------------------------------------------------------------------------
// Checks.
// ---------------------------------------------------------------------------------------------

/// Ledger invariants of one budget from INFO, PENDING COUNT 10000 and INFO again in one MULTI
/// (retried if a reservation expired in between). `Ok(false)`: no budget at the key.
fn check_budget(c: &mut redis::Connection, key: &str) -> Result<bool, String> {
    let ints = |v: &Value| -> BTreeMap<String, i64> {
        match v {
            Value::Array(a) => a
                .chunks(2)
                .filter_map(|p| match (&p[0], &p[1]) {
                    (Value::BulkString(k), Value::Int(n)) => {
                        Some((String::from_utf8_lossy(k).into_owned(), *n))
                    }
                    _ => None,
                })
                .collect(),
            _ => BTreeMap::new(),
        }
    };
    for _ in 0..20 {
        let r: Vec<Value> = redis::pipe()
            .atomic()
            .cmd("QUOTA.INFO")
            .arg(key)
            .cmd("QUOTA.PENDING")
            .arg(key)
            .arg("COUNT")
            .arg(10_000)
            .cmd("QUOTA.INFO")
            .arg(key)
            .query(c)
            .map_err(|e| format!("{key}: {e}"))?;
        if r[0] == Value::Nil {
            return Ok(false);
        }
        let (a, b) = (ints(&r[0]), ints(&r[2]));
        if a != b {
            continue;
        }
        let Value::Array(entries) = &r[1] else {
            return Err(format!("{key}: PENDING {:?}", r[1]));
        };
        let sum: i64 = entries
            .iter()
            .map(|e| match e {
                Value::Array(f) => match f.get(1) {
                    Some(Value::Int(n)) => *n,
                    _ => 0,
                },
                _ => 0,
            })
            .sum();
        let (limit, used, reserved, available, pending) = (
            a["limit"],
            a["used"],
            a["reserved"],
            a["available"],
            a["pending"],
        );
        if available != limit - used - reserved {
            return Err(format!(
                "{key}: available != limit - used - reserved: {a:?}"
            ));
        }
        if sum != reserved || pending != entries.len() as i64 {
            return Err(format!(
                "{key}: reserved {reserved} / pending {pending} but PENDING lists {} summing {sum}",
                entries.len()
            ));
        }
        if used < 0 || reserved < 0 {
            return Err(format!("{key}: negative counter {a:?}"));
        }
        return Ok(true);
    }
    Err(format!("{key}: kept changing inside one MULTI"))
}

/// Keys whose digests differ between the two servers (for the report).
fn differing_keys(m: &mut redis::Connection, r: &mut redis::Connection) -> Vec<String> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("soak:*")
        .query(m)
        .unwrap_or_default();
    let digest = |c: &mut redis::Connection, k: &str| -> String {
        format!(
            "{:?}",
            redis::cmd("DEBUG")
                .arg("DIGEST-VALUE")
                .arg(k)
                .query::<Value>(c)
        )
    };
    keys.into_iter()
        .filter(|k| digest(m, k) != digest(r, k))
        .take(20)
        .collect()
}

struct Sample {
    at: Duration,
    /// Commands processed by the master so far.
    ops: i64,
    master_mem: i64,
    /// `used_memory_dataset`: without the replication backlog, buffers and overhead.
    master_dataset: i64,
    replica_mem: i64,
    keys: i64,
    pending: i64,
    remembered: i64,
    /// Keys in the sweeper's index.
    indexed: i64,
}

fn run() -> Result<bool, String> {
    let minutes = env_f64("SOAK_MINUTES", 10.0);
    let check_every = Duration::from_secs_f64(env_f64("SOAK_CHECK_SECONDS", 15.0));
    let threads = env_f64("SOAK_THREADS", 8.0) as usize;
    let seed = env_f64("SOAK_SEED", 1.0) as u64;
    let module = module_path()?;
    println!(
        "soak: {minutes} min, {threads} connections, checks every {check_every:?}, seed {seed}, \
         module {}",
        module.display()
    );
    let mut master = Server::start(
        "master",
        &module,
        &[
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--aof-use-rdb-preamble",
            "yes",
        ],
        &["finished-ttl", "5000"],
    );
    let mut replica = Server::start("replica", &module, &[], &[]);
    let mut m = master.conn();
    let mut r = replica.conn();
    let _: Value = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port)
        .query(&mut r)
        .map_err(|e| e.to_string())?;
    let link_deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut r)
            .unwrap_or_default();
        if info.contains("master_link_status:up") {
            break;
        }
        if Instant::now() > link_deadline {
            return Err("the replica never connected".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for i in 0..BUDGETS as u64 {
        let mut rng = Rng(i + 1);
        let _: Value = set_cmd(&budget(i), &mut rng)
            .query(&mut m)
            .map_err(|e| e.to_string())?;
    }

    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        paused: AtomicBool::new(false),
        pause_epoch: AtomicU64::new(0),
        stats: Mutex::new(Stats::default()),
    });
    let start = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let shared = shared.clone();
            let port = master.port;
            std::thread::spawn(move || worker(port, seed * 1_000 + t as u64 + 1, shared))
        })
        .collect();

    let deadline = start + Duration::from_secs_f64(minutes * 60.0);
    let mut failures: Vec<String> = Vec::new();
    let mut samples: Vec<Sample> = Vec::new();
    let (mut digests_compared, mut budgets_checked, mut rewrites, mut bgsaves) = (0u64, 0u64, 0, 0);
    let mut rng = Rng(seed.wrapping_mul(7919) | 1);
    let mut round = 0u64;
    while Instant::now() < deadline && failures.is_empty() {
        std::thread::sleep(check_every.min(deadline.saturating_duration_since(Instant::now())));
        round += 1;
        if !master.alive() || !replica.alive() {
            failures.push("a server died".into());
            break;
        }
        // Persistence in the background while the workload runs.
        let busy: String = redis::cmd("INFO")
            .arg("persistence")
            .query(&mut m)
            .unwrap_or_default();
        if busy.contains("aof_rewrite_in_progress:0") && busy.contains("rdb_bgsave_in_progress:0") {
            if round % 2 == 1 {
                if redis::cmd("BGREWRITEAOF").query::<Value>(&mut m).is_ok() {
                    rewrites += 1;
                }
            } else if redis::cmd("BGSAVE").query::<Value>(&mut m).is_ok() {
                bgsaves += 1;
            }
        }
        // A quiescent point: no client writes, no expiry, no sweeper; the replica caught up.
        let (ok, checked) = checkpoint(&mut m, &mut r, &shared, &mut rng, 30, &mut failures);
        digests_compared += u64::from(ok);
        budgets_checked += checked;
        let ops = info_field(&mut m, "stats", "total_commands_processed");
        samples.push(Sample {
            at: start.elapsed(),
            ops,
            master_mem: info_field(&mut m, "memory", "used_memory"),
            master_dataset: info_field(&mut m, "memory", "used_memory_dataset"),
            replica_mem: info_field(&mut r, "memory", "used_memory"),
            keys: redis::cmd("DBSIZE").query(&mut m).unwrap_or(-1),
            pending: info_field(&mut m, "quota", "quota_pending_reservations"),
            remembered: info_field(&mut m, "quota", "quota_remembered_ids"),
            indexed: info_field(&mut m, "quota", "quota_sweeper_indexed_keys"),
        });
        let s = samples.last().unwrap();
        println!(
            "  {:>6.0}s  digests equal: {}  used_memory master {} replica {}",
            s.at.as_secs_f64(),
            ok,
            s.master_mem,
            s.replica_mem
        );
    }
    shared.stop.store(true, Ordering::SeqCst);
    for w in workers {
        let _ = w.join();
    }

    // Final: every budget checked, digests once more, then the AOF reload.
    if failures.is_empty() {
        let (ok, _) = checkpoint(&mut m, &mut r, &shared, &mut rng, 0, &mut failures);
        digests_compared += u64::from(ok);
        for i in 0..BUDGETS as u64 {
            match check_budget(&mut m, &budget(i)) {
                Ok(found) => budgets_checked += u64::from(found),
                Err(e) => failures.push(e),
            }
        }
    }
    let mut aof_keys = 0;
    if failures.is_empty() {
        // DEBUG LOADAOF flushes the AOF and loads it back from disk (its base, rewritten many
        // times by now, and the incremental files). Paused throughout, so neither the workload
        // nor the sweeper nor active expiry changes anything in between.
        let _ = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(60_000)
            .arg("WRITE")
            .query::<Value>(&mut m);
        // Keys with over 65 s left before must all be there after (kept if over 60 s left).
        let before = stable_digests(&mut m, 65_000);
        match redis::cmd("DEBUG").arg("LOADAOF").query::<Value>(&mut m) {
            Ok(_) => {
                let after = stable_digests(&mut m, 60_000);
                for (k, d) in &before {
                    match after.get(k) {
                        Some(a) if a == d => aof_keys += 1,
                        other => failures.push(format!("AOF reload changed {k}: {d} -> {other:?}")),
                    }
                }
            }
            Err(e) => failures.push(format!("DEBUG LOADAOF: {e}")),
        }
        let _ = redis::cmd("CLIENT").arg("UNPAUSE").query::<Value>(&mut m);
    }

    // Summary.
    let stats = shared.stats.lock().unwrap();
    let total: u64 = stats.ops.values().sum();
    let elapsed = start.elapsed();
    println!(
        "\n== soak summary ({:.1} min) ==",
        elapsed.as_secs_f64() / 60.0
    );
    println!(
        "operations: {total} ({:.0}/s) {:?}",
        total as f64 / elapsed.as_secs_f64(),
        stats.ops
    );
    println!("error replies: {:?}", stats.errors);
    println!(
        "latency (outside CLIENT PAUSE): p50 <= {:?}, p99 <= {:?}, p99.9 <= {:?}, max {:?}",
        stats.percentile(0.5),
        stats.percentile(0.99),
        stats.percentile(0.999),
        stats.max_latency
    );
    println!(
        "digest comparisons master/replica: {digests_compared} equal; budgets checked: \
         {budgets_checked}; BGREWRITEAOF: {rewrites}, BGSAVE: {bgsaves}; keys equal after AOF \
         reload: {aof_keys}"
    );
    println!(
        "quota INFO: sweeper released {}, keys {}",
        info_field(&mut m, "quota", "quota_sweeper_released"),
        info_field(&mut m, "quota", "quota_budget_keys")
    );
    println!("memory over time:");
    println!(
        "  {:>7} {:>12} {:>16} {:>16} {:>16} {:>8} {:>8} {:>10} {:>8}",
        "t (s)",
        "commands",
        "master used_mem",
        "master dataset",
        "replica used_mem",
        "keys",
        "pending",
        "remembered",
        "indexed"
    );
    for s in &samples {
        println!(
            "  {:>7.0} {:>12} {:>16} {:>16} {:>16} {:>8} {:>8} {:>10} {:>8}",
            s.at.as_secs_f64(),
            s.ops,
            s.master_mem,
            s.master_dataset,
            s.replica_mem,
            s.keys,
            s.pending,
            s.remembered,
            s.indexed
        );
    }
    for u in &stats.unexpected {
        failures.push(format!("unexpected reply: {u}"));
    }
    if stats.errors.contains_key("unexpected") && stats.unexpected.is_empty() {
        failures.push("unexpected error replies".into());
    }
    for (s, name) in [(&master, "master"), (&replica, "replica")] {
        if s.log().contains("PANIC") {
            failures.push(format!("{name} logged a panic"));
        }
    }
    if digests_compared == 0 {
        failures.push("no digest comparison ran".into());
    }
    if failures.is_empty() {
        println!("soak: OK");
        Ok(true)
    } else {
        for f in &failures {
            println!("FAILURE: {f}");
        }
        Ok(false)
    }
}

/// Pauses writes on the master, waits for the replica, compares `DEBUG DIGEST` and checks
/// `sample` random budgets (0: none), then unpauses. Returns (digests equal, budgets checked).
fn checkpoint(
    m: &mut redis::Connection,
    r: &mut redis::Connection,
    shared: &Shared,
    rng: &mut Rng,
    sample: usize,
    failures: &mut Vec<String>,
) -> (bool, u64) {
    shared.paused.store(true, Ordering::SeqCst);
    shared.pause_epoch.fetch_add(1, Ordering::SeqCst);
    let paused = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(30_000)
        .arg("WRITE")
        .query::<Value>(m);
    let mut equal = false;
    let mut checked = 0;
    if let Err(e) = paused {
        failures.push(format!("CLIENT PAUSE: {e}"));
    } else {
        let acked: i64 = redis::cmd("WAIT").arg(1).arg(20_000).query(m).unwrap_or(0);
        // WAIT counts acknowledged offsets; the replica applies what it acknowledged first.
        let dm: String = redis::cmd("DEBUG")
            .arg("DIGEST")
            .query(m)
            .unwrap_or_default();
        let mut dr = String::new();
        for _ in 0..50 {
            dr = redis::cmd("DEBUG")
                .arg("DIGEST")
                .query(r)
                .unwrap_or_default();
            if dr == dm {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        equal = acked == 1 && dm == dr && !dm.is_empty();
        if !equal {
            failures.push(format!(
                "master and replica differ (WAIT {acked}): {dm} vs {dr}; keys: {:?}",
                differing_keys(m, r)
            ));
        }
        for _ in 0..sample {
            let key = budget(rng.below(BUDGETS as u64));
            match check_budget(m, &key) {
                Ok(found) => checked += u64::from(found),
                Err(e) => failures.push(e),
            }
        }
    }
    let _ = redis::cmd("CLIENT").arg("UNPAUSE").query::<Value>(m);
    shared.paused.store(false, Ordering::SeqCst);
    (equal, checked)
}

/// Digests of keys without a TTL or with more than `min_ttl_ms` left.
fn stable_digests(c: &mut redis::Connection, min_ttl_ms: i64) -> BTreeMap<String, String> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("soak:*")
        .query(c)
        .unwrap_or_default();
    let mut out = BTreeMap::new();
    for k in keys {
        let ttl: i64 = redis::cmd("PTTL").arg(&k).query(c).unwrap_or(0);
        if ttl == -1 || ttl > min_ttl_ms {
            let d: Value = redis::cmd("DEBUG")
                .arg("DIGEST-VALUE")
                .arg(&k)
                .query(c)
                .unwrap_or(Value::Nil);
            out.insert(k, format!("{d:?}"));
        }
    }
    out
}
