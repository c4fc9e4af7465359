//! quota-export against a real redis-server with the module, and a real database: a SQLite
//! file, and a PostgreSQL server started for the test (Debian's postgresql 15: `initdb` and
//! `pg_ctl` in a temp dir, as the `postgres` user when run as root).
//!
//! A random workload of reserves, settles, rollbacks, expiries, charges, forced charges and
//! period resets runs while two exporters of one consumer group export it; each is killed
//! with SIGKILL at random points and restarted. At the end every stream entry is in the
//! database exactly once, the malformed entries injected are skipped and counted, and
//! `quota-export reconcile` passes. `EXPORT_SEED=n` replays a run.

#[path = "../../tests/common/mod.rs"]
mod common;
use common::*;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const EXPORTER: &str = env!("CARGO_BIN_EXE_quota-export");
/// 2100-01-01T00:00Z.
const T: i64 = 4_102_444_800_000;

/// The module the root crate built (make test sets QUOTA_MODULE; plain `cargo test` here
/// finds the debug build next door).
fn use_module() {
    if std::env::var_os("QUOTA_MODULE").is_none() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/libredis_quota.so");
        // SAFETY (edition 2021: safe fn): set before any server starts, tests read it only.
        std::env::set_var("QUOTA_MODULE", p);
    }
}

/// A small deterministic generator (xorshift64*), seeded from EXPORT_SEED or the clock.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = std::env::var("EXPORT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        eprintln!("EXPORT_SEED={seed}");
        Rng(seed | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A PostgreSQL server in a temp dir on a free port, stopped and removed on drop.
struct Postgres {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
}

fn as_postgres(bin: &Path, tool: &str) -> Command {
    let exe = bin.join(tool);
    // initdb refuses to run as root: run the server as the `postgres` user then.
    if unsafe { libc_geteuid() } == 0 {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(exe);
        c
    } else {
        Command::new(exe)
    }
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

impl Postgres {
    fn start() -> Postgres {
        let bin = std::env::var_os("PG_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"));
        assert!(
            bin.join("initdb").exists(),
            "PostgreSQL is not installed at {} (make deps installs Debian's postgresql; PG_BIN overrides the path)",
            bin.display()
        );
        let dir = std::env::temp_dir().join(format!(
            "rq-pg-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        if unsafe { libc_geteuid() } == 0 {
            let st = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .unwrap();
            assert!(st.success());
        }
        let data = dir.join("data");
        let out = as_postgres(&bin, "initdb")
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut pg = Postgres { dir, bin, port: 0 };
        for _ in 0..5 {
            pg.port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let opts = format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
                pg.port,
                pg.dir.display()
            );
            let st = as_postgres(&pg.bin, "pg_ctl")
                .args(["-w", "-t", "30", "-D"])
                .arg(&data)
                .args(["-o", &opts, "-l"])
                .arg(pg.dir.join("log"))
                .arg("start")
                .stdout(Stdio::null())
                .status()
                .unwrap();
            if st.success() {
                return pg;
            }
        }
        panic!(
            "pg_ctl start failed: {}",
            std::fs::read_to_string(pg.dir.join("log")).unwrap_or_default()
        );
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = as_postgres(&self.bin, "pg_ctl")
            .args(["-D"])
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const STREAMS: [&str; 2] = ["usage:a", "usage:b"];
const KEYS: [(&str, &str); 4] = [
    ("k0", "usage:a"),
    ("k1", "usage:a"),
    ("k2", "usage:b"),
    ("k3", "usage:b"),
];

fn exporter(redis: &str, db: &str, consumer: &str, extra: &[&str]) -> Command {
    let mut c = Command::new(EXPORTER);
    c.args(["run", "--redis", redis, "--db", db, "--consumer", consumer]);
    for s in STREAMS {
        c.args(["--stream", s]);
    }
    c.args(["--batch", "7", "--block-ms", "50"]);
    c.args(extra);
    c
}

fn spawn(cmd: &mut Command, log: &Path) -> Child {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    cmd.stdout(Stdio::null()).stderr(f).spawn().unwrap()
}

/// Runs one random operation at test time `t` on a random budget.
fn random_op(c: &mut redis::Connection, rng: &mut Rng, t: i64, n: u64) {
    let (key, _) = KEYS[rng.below(4) as usize];
    let at = t.to_string();
    let id = format!("r{n}");
    let amount = (1 + rng.below(20)).to_string();
    let _ = match rng.below(10) {
        // A reservation, finished now, later (by its id) or never (it expires).
        0..=2 => q(
            c,
            &[
                "QUOTA.RESERVE",
                key,
                &amount,
                "ID",
                &id,
                "TTL",
                &(1 + rng.below(5000)).to_string(),
                "AT",
                &at,
            ],
        ),
        3 | 4 => {
            let old = format!("r{}", n.saturating_sub(1 + rng.below(6)));
            q(c, &["QUOTA.SETTLE", key, &old, &amount, "AT", &at])
        }
        5 => {
            let old = format!("r{}", n.saturating_sub(1 + rng.below(6)));
            q(c, &["QUOTA.ROLLBACK", key, &old, "AT", &at])
        }
        6 => q(c, &["QUOTA.CHARGE", key, &amount, "AT", &at]),
        7 => q(
            c,
            &[
                "QUOTA.CHARGE",
                key,
                &amount,
                "ID",
                &format!("c{n}"),
                "AT",
                &at,
            ],
        ),
        8 => q(c, &["QUOTA.CHARGE", key, &amount, "FORCE", "AT", &at]),
        _ => q(
            c,
            &[
                "QUOTA.SET",
                key,
                "USED",
                &rng.below(50).to_string(),
                "AT",
                &at,
            ],
        ),
    };
}

/// Entries of both streams as `(stream, id)`.
fn stream_ids(c: &mut redis::Connection) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for s in STREAMS {
        for e in items(&ok(c, &["XRANGE", s, "-", "+"])) {
            out.insert((s.to_string(), text(&items(&e)[0])));
        }
    }
    out
}

fn db_ids(db: &str) -> (BTreeSet<(String, String)>, i64, i64) {
    let q1 = "SELECT stream, entry_id FROM quota_usage";
    let q2 = "SELECT COUNT(*) FROM quota_usage";
    let q3 = "SELECT COUNT(*) FROM quota_usage_rejects";
    if db.starts_with("postgres://") {
        let mut c = postgres::Client::connect(db, postgres::NoTls).unwrap();
        let ids = c
            .query(q1, &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let n: i64 = c.query_one(q2, &[]).unwrap().get(0);
        let rej: i64 = c.query_one(q3, &[]).unwrap().get(0);
        (ids, n, rej)
    } else {
        let c = rusqlite::Connection::open(db).unwrap();
        let mut st = c.prepare(q1).unwrap();
        let ids = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let n: i64 = c.query_row(q2, [], |r| r.get(0)).unwrap();
        let rej: i64 = c.query_row(q3, [], |r| r.get(0)).unwrap();
        (ids, n, rej)
    }
}

/// GET `/metrics` from `addr`.
fn scrape(addr: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// The whole scenario against `db` (a SQLite path or a postgres:// URL).
fn export_exactly_once(db: &str, logdir: &Path) {
    use_module();
    let server = Server::start_with_module_args(&[], &["test-clock", "yes", "sweep-effort", "0"]);
    let redis = format!("redis://127.0.0.1:{}/", server.port);
    let mut c = server.conn();
    let mut rng = Rng::new();
    for (key, stream) in KEYS {
        // HOUR periods: the workload crosses several boundaries (resets).
        ok(
            &mut c,
            &[
                "QUOTA.SET",
                key,
                "LIMIT",
                "400",
                "OVERDRAFT",
                "10",
                "PERIOD",
                "HOUR",
                "STREAM",
                stream,
                "STREAMMAXLEN",
                "0",
                "AT",
                &T.to_string(),
            ],
        );
    }
    let log = logdir.join("exporters.log");
    let consumers = ["c1", "c2"];
    let mut children: Vec<Child> = consumers
        .iter()
        .map(|name| {
            spawn(
                &mut exporter(&redis, db, name, &["--claim-idle-ms", "300"]),
                &log,
            )
        })
        .collect();
    let mut malformed = 0;
    let mut t = T;
    let mut kills = 0;
    let ops = 3000u64;
    for n in 0..ops {
        // Mostly small steps, sometimes a jump past deadlines or an hour boundary.
        t += match rng.below(100) {
            0 => 3_600_000,
            1..=5 => 10_000,
            _ => rng.below(200) as i64,
        };
        random_op(&mut c, &mut rng, t, n);
        if n % 500 == 250 {
            // Bad input: missing fields, a non-integer, a bad event.
            let s = STREAMS[rng.below(2) as usize];
            ok(&mut c, &["XADD", s, "*", "key", "k0", "event", "settle"]);
            ok(
                &mut c,
                &[
                    "XADD",
                    s,
                    "*",
                    "key",
                    "k0",
                    "event",
                    "charge",
                    "id",
                    "",
                    "held",
                    "-1",
                    "charged",
                    "x",
                    "used",
                    "1",
                    "period_start",
                    "-1",
                    "at",
                    "1",
                ],
            );
            ok(&mut c, &["XADD", s, "*", "garbage", "1"]);
            malformed += 3;
        }
        if rng.below(150) == 0 {
            // SIGKILL one exporter at a random point, restart it (same consumer name).
            let i = rng.below(2) as usize;
            children[i].kill().unwrap();
            children[i].wait().unwrap();
            kills += 1;
            if rng.below(3) > 0 {
                children[i] = spawn(
                    &mut exporter(&redis, db, consumers[i], &["--claim-idle-ms", "300"]),
                    &log,
                );
            } else {
                // Dead for a while: the other consumer claims its pending entries.
                std::thread::sleep(Duration::from_millis(rng.below(400)));
                children[i] = spawn(
                    &mut exporter(&redis, db, consumers[i], &["--claim-idle-ms", "300"]),
                    &log,
                );
            }
        }
    }
    assert!(kills >= 5, "too few kills for a meaningful run: {kills}");
    // Let them catch up, then kill both mid-flight once more.
    std::thread::sleep(Duration::from_millis(200));
    for ch in &mut children {
        ch.kill().unwrap();
        ch.wait().unwrap();
    }
    // Finish: each consumer takes back its own pending entries, then claims any left.
    for name in consumers {
        let st = exporter(&redis, db, name, &["--once", "--claim-idle-ms", "0"])
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "final --once run of {name} failed");
    }
    // Every entry exactly once: the database holds exactly the stream's usage entries.
    let in_stream = stream_ids(&mut c);
    let (in_db, rows, rejects) = db_ids(db);
    assert_eq!(rejects, malformed, "malformed entries skipped and recorded");
    assert_eq!(rows as usize, in_db.len());
    assert_eq!(in_db.len() + malformed as usize, in_stream.len());
    assert!(in_db.is_subset(&in_stream));
    let events: i64 = STREAMS.iter().map(|s| int(&ok(&mut c, &["XLEN", s]))).sum();
    assert_eq!(events as usize, in_stream.len());
    // Nothing pending in the group.
    for s in STREAMS {
        let p = items(&ok(&mut c, &["XPENDING", s, "quota-export"]));
        assert_eq!(int(&p[0]), 0, "{s} still has pending entries");
    }
    // reconcile passes.
    let out = Command::new(EXPORTER)
        .args(["reconcile", "--redis", &redis, "--db", db])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "reconcile failed:\n{table}");
    for (key, _) in KEYS {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(key) && l.ends_with("ok")),
            "{table}"
        );
    }
    // A change not exported yet is a mismatch, and reconcile says so.
    ok(
        &mut c,
        &[
            "QUOTA.CHARGE",
            "k0",
            "5",
            "FORCE",
            "AT",
            &(t + 1).to_string(),
        ],
    );
    let out = Command::new(EXPORTER)
        .args(["reconcile", "--redis", &redis, "--db", db])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    assert!(
        table.contains("MISMATCH") && table.contains("not yet exported"),
        "{table}"
    );

    // Metrics while running: charged units, events by kind, malformed entries, lag.
    let addr = free_addr();
    let mut ch = spawn(
        &mut exporter(&redis, db, "c3", &["--metrics-addr", &addr]),
        &log,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        if let Some(b) = scrape(&addr) {
            if b.contains("quota_export_lag{stream=\"usage:a\",group=\"quota-export\"} 0") {
                break b;
            }
        }
        assert!(
            Instant::now() < deadline,
            "metrics never showed the caught-up lag"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    ch.kill().unwrap();
    ch.wait().unwrap();
    assert!(
        body.contains("quota_export_charged_units_total{key=\"k0\"} 5"),
        "{body}"
    );
    assert!(
        body.contains("quota_export_events_total{key=\"k0\",event=\"forced_charge\"} 1"),
        "{body}"
    );
    assert!(body.contains("# TYPE quota_export_lag gauge"), "{body}");
    let out = Command::new(EXPORTER)
        .args(["reconcile", "--redis", &redis, "--db", db])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn sqlite_gets_every_entry_exactly_once_through_kills() {
    let dir = std::env::temp_dir().join(format!("rq-export-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("usage.db");
    export_exactly_once(db.to_str().unwrap(), &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn postgres_gets_every_entry_exactly_once_through_kills() {
    let pg = Postgres::start();
    let dir = pg.dir.join("logs");
    std::fs::create_dir_all(&dir).unwrap();
    export_exactly_once(&pg.url(), &dir);
}

#[test]
fn reconcile_says_when_the_stream_was_trimmed_past_the_group() {
    use_module();
    let server = Server::start_with_module_args(&[], &["test-clock", "yes", "sweep-effort", "0"]);
    let redis = format!("redis://127.0.0.1:{}/", server.port);
    let mut c = server.conn();
    let dir = std::env::temp_dir().join(format!("rq-export-trim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("u.db");
    let db = db.to_str().unwrap();
    ok(&mut c, &["CONFIG", "SET", "stream-node-max-entries", "2"]);
    ok(
        &mut c,
        &[
            "QUOTA.SET",
            "k",
            "LIMIT",
            "1000",
            "STREAM",
            "s",
            "STREAMMAXLEN",
            "2",
            "AT",
            &T.to_string(),
        ],
    );
    ok(&mut c, &["QUOTA.CHARGE", "k", "1", "AT", &T.to_string()]);
    let st = Command::new(EXPORTER)
        .args([
            "run", "--redis", &redis, "--db", db, "--stream", "s", "--once",
        ])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    for i in 0..10 {
        ok(
            &mut c,
            &["QUOTA.CHARGE", "k", "1", "AT", &(T + i).to_string()],
        );
    }
    let out = Command::new(EXPORTER)
        .args(["reconcile", "--redis", &redis, "--db", db])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("TRIMMED PAST THE GROUP"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `quota-export reconcile` against `redis`, `db`: (exit status, stdout, stderr).
fn reconcile_out(redis: &str, db: &str) -> (Option<i32>, String, String) {
    reconcile_with(redis, db, &[])
}

/// A server with the module for one test, its URL, and a SQLite path in its temp dir (not
/// created).
fn server_and_db() -> (Server, String, String) {
    use_module();
    let server = Server::start(&[]);
    let redis = format!("redis://127.0.0.1:{}/", server.port);
    let db = server.dir.join("u.db").to_str().unwrap().to_string();
    (server, redis, db)
}

/// `QUOTA.SET budget LIMIT limit STREAM stream STREAMMAXLEN maxlen`.
fn budget_logging_to(
    c: &mut redis::Connection,
    budget: &str,
    limit: &str,
    stream: &str,
    maxlen: &str,
) {
    ok(
        c,
        &[
            "QUOTA.SET",
            budget,
            "LIMIT",
            limit,
            "STREAM",
            stream,
            "STREAMMAXLEN",
            maxlen,
        ],
    );
}

/// `quota-export run --once` of `streams`: (exit status, stderr).
fn run_once(redis: &str, db: &str, streams: &[&str]) -> (Option<i32>, String) {
    let mut c = Command::new(EXPORTER);
    c.args(["run", "--redis", redis, "--db", db, "--once"]);
    for s in streams {
        c.args(["--stream", s]);
    }
    let out = c.stdout(Stdio::null()).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn last_line(text: &str) -> &str {
    text.lines().last().unwrap_or_default()
}

/// Issue 21's reproduction: the stream is trimmed past the group; reconcile names the trim
/// (count, table status, closing line) before the exporter catches up and after, when
/// Redis' own lag still counts the trimmed entries and exporting again cannot help.
#[test]
fn reconcile_names_the_trim_before_and_after_catching_up() {
    let (server, redis, db) = server_and_db();
    let db = db.as_str();
    let mut c = server.conn();
    budget_logging_to(&mut c, "{tr}:b", "100000", "{tr}:u", "10");
    ok(&mut c, &["QUOTA.CHARGE", "{tr}:b", "1"]);
    assert_eq!(run_once(&redis, db, &["{tr}:u"]).0, Some(0));
    for _ in 0..400 {
        ok(&mut c, &["QUOTA.CHARGE", "{tr}:b", "1"]);
    }
    let len = int(&ok(&mut c, &["XLEN", "{tr}:u"]));
    assert!(len < 400, "the stream was trimmed: {len}");
    // 401 added, 1 read, `len` still there.
    let lost = format!("TRIMMED PAST THE GROUP: {} entries", 400 - len);

    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains(&lost), "{out}");
    assert!(
        out.contains(&format!("not yet exported: {len} unread")),
        "{out}"
    );
    assert!(
        out.contains("MISMATCH (entries of {tr}:u lost before export)"),
        "{out}"
    );
    assert!(
        last_line(&out).contains("deleted from the stream (trimmed or XDEL) before export")
            && last_line(&out).contains("also not exported yet"),
        "{out}"
    );

    // Part way through (another consumer read 5 and holds them): the entries after the
    // group's position are counted (XRANGE), the loss is the same.
    let _ = ok(
        &mut c,
        &[
            "XREADGROUP",
            "GROUP",
            "quota-export",
            "other",
            "COUNT",
            "5",
            "STREAMS",
            "{tr}:u",
            ">",
        ],
    );
    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains(&lost), "{out}");
    assert!(
        out.contains(&format!("not yet exported: {} unread, 5 pending", len - 5)),
        "{out}"
    );

    // Caught up (the other consumer's 5 claimed at once).
    let st = Command::new(EXPORTER)
        .args(["run", "--redis", &redis, "--db", db, "--once"])
        .args(["--stream", "{tr}:u", "--claim-idle-ms", "0"])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    for _ in 0..2 {
        let (code, out, _) = reconcile_out(&redis, db);
        assert_eq!(code, Some(1), "{out}");
        assert!(out.contains(&lost), "{out}");
        assert!(!out.contains("not yet exported"), "{out}");
        assert!(!out.contains("run --once"), "{out}");
        assert!(
            out.contains("MISMATCH (entries of {tr}:u lost before export)"),
            "{out}"
        );
        assert!(
            last_line(&out).contains("deleted from the stream (trimmed or XDEL) before export")
                && !last_line(&out).contains("not exported yet"),
            "{out}"
        );
    }
    // The documented acknowledgement: the group's read counter set to the entries added.
    let xinfo = items(&ok(&mut c, &["XINFO", "STREAM", "{tr}:u"]));
    let added = xinfo
        .iter()
        .position(|v| matches!(v, redis::Value::BulkString(b) if b == b"entries-added"))
        .map(|i| int(&xinfo[i + 1]))
        .unwrap();
    let last = xinfo
        .iter()
        .position(|v| matches!(v, redis::Value::BulkString(b) if b == b"last-generated-id"))
        .map(|i| text(&xinfo[i + 1]))
        .unwrap();
    ok(
        &mut c,
        &[
            "XGROUP",
            "SETID",
            "{tr}:u",
            "quota-export",
            &last,
            "ENTRIESREAD",
            &added.to_string(),
        ],
    );
    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!(code, Some(1), "{out}");
    assert!(!out.contains("TRIMMED"), "{out}");
    assert!(
        last_line(&out).starts_with(
            "reconcile: FAILED (1 budget key(s) do not match; for 1 of them nothing seen \
             explains it"
        ),
        "{out}"
    );
}

/// A wrong `--db` is an error, never an empty database that matches: a missing SQLite file
/// is not created, a file without the tables is refused, and a database with no rows is
/// "nothing to compare" (status 1), not OK.
#[test]
fn reconcile_refuses_a_missing_or_empty_sqlite_database() {
    use_module();
    let server = Server::start(&[]);
    let redis = format!("redis://127.0.0.1:{}/", server.port);
    let missing = server.dir.join("x").join("empty.db");
    let (code, out, err) = reconcile_out(&redis, missing.to_str().unwrap());
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("no such file"), "{err}");
    assert!(!missing.exists());
    let missing = server.dir.join("empty.db");
    let (code, _, err) = reconcile_out(&redis, missing.to_str().unwrap());
    assert_eq!(code, Some(2), "{err}");
    assert!(!missing.exists(), "reconcile created {}", missing.display());

    // An existing file that is not an exporter's database (an empty file is an empty SQLite
    // database).
    let other = server.dir.join("other.db");
    std::fs::write(&other, b"").unwrap();
    let (code, _, err) = reconcile_out(&redis, other.to_str().unwrap());
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("has no quota_usage"), "{err}");

    // The exporter's database, but nothing exported yet.
    let db = server.dir.join("u.db");
    let db = db.to_str().unwrap();
    assert_eq!(run_once(&redis, db, &["{e}:u"]).0, Some(0));
    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        last_line(&out).contains("nothing to compare: the database has no usage rows"),
        "{out}"
    );
}

/// Pointed at a Redis database without the budgets, reconcile says nothing was compared
/// (status 1); with some budgets present, one deleted since is still not a mismatch.
#[test]
fn reconcile_against_the_wrong_redis_database_is_not_ok() {
    let (server, redis, db) = server_and_db();
    let db = db.as_str();
    let mut c = server.conn();
    for key in ["{a}:b1", "{a}:b2"] {
        ok(
            &mut c,
            &["QUOTA.SET", key, "LIMIT", "100", "STREAM", "{a}:u"],
        );
        ok(&mut c, &["QUOTA.CHARGE", key, "3"]);
    }
    assert_eq!(run_once(&redis, db, &["{a}:u"]).0, Some(0));
    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(last_line(&out), "reconcile: OK", "{out}");
    // A report that cannot be written (a full disk, a closed pipe) is an error, not a panic.
    let full = Command::new(EXPORTER)
        .args(["reconcile", "--redis", &redis, "--db", db])
        .stdout(std::fs::File::create("/dev/full").unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&full.stderr);
    assert_eq!(full.status.code(), Some(2), "{err}");
    assert!(err.contains("writing the report to stdout"), "{err}");
    // A log that cannot be written is dropped, not a panic.
    let full = Command::new(EXPORTER)
        .args(["reconcile", "--redis", "redis://127.0.0.1:1/", "--db", db])
        .stderr(std::fs::File::create("/dev/full").unwrap())
        .status()
        .unwrap();
    assert_eq!(full.code(), Some(2));

    let wrong = format!("redis://127.0.0.1:{}/5", server.port);
    let (code, out, _) = reconcile_out(&wrong, db);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("stream {a}:u: missing in Redis"), "{out}");
    assert!(
        last_line(&out).contains("nothing to compare: none of the database's 2 budget keys"),
        "{out}"
    );

    // The normal case: one budget deleted since, the other still compared.
    ok(&mut c, &["DEL", "{a}:b1"]);
    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("gone (no budget at this key)"), "{out}");
    // The gone key's line shows what the database holds of it (its latest period).
    let gone: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("{a}:b1 "))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(&gone[..5], ["{a}:b1", "-1", "3", "-", "-"], "{out}");
    assert_eq!(last_line(&out), "reconcile: OK", "{out}");
    ok(&mut c, &["DEL", "{a}:b2"]);
    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!(code, Some(1), "{out}");
    assert!(last_line(&out).contains("nothing to compare"), "{out}");
}

/// PostgreSQL: reconcile never creates the tables (they are checked with `to_regclass`),
/// and a database with the tables but no rows is "nothing to compare".
#[test]
fn reconcile_refuses_a_postgres_database_without_the_tables() {
    use_module();
    let pg = Postgres::start();
    let server = Server::start(&[]);
    let redis = format!("redis://127.0.0.1:{}/", server.port);
    let (code, out, err) = reconcile_out(&redis, &pg.url());
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("has no quota_usage"), "{err}");
    let mut pc = postgres::Client::connect(&pg.url(), postgres::NoTls).unwrap();
    let created: bool = pc
        .query_one("SELECT to_regclass('quota_usage') IS NOT NULL", &[])
        .unwrap()
        .get(0);
    assert!(!created, "reconcile created the table");

    assert_eq!(run_once(&redis, &pg.url(), &["{e}:u"]).0, Some(0));
    let (code, out, _) = reconcile_out(&redis, &pg.url());
    assert_eq!(code, Some(1), "{out}");
    assert!(
        last_line(&out).contains("nothing to compare: the database has no usage rows"),
        "{out}"
    );
}

/// Against a replica: reconcile notes that it belongs on the master, and where the replica
/// does not keep the group's entries-read (Redis 7.0) it says the trim check could not be
/// made and why, never a bare MISMATCH. (Valkey replicas keep entries-read: then the trim
/// is named as on the master.)
#[test]
fn reconcile_on_a_replica_says_why_the_trim_check_cannot_be_made() {
    use_module();
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    replica.replicate_from(&master);
    let redis = format!("redis://127.0.0.1:{}/", master.port);
    let on_replica = format!("redis://127.0.0.1:{}/", replica.port);
    let mut c = master.conn();
    let db = master.dir.join("u.db");
    let db = db.to_str().unwrap();
    budget_logging_to(&mut c, "{r}:b", "100000", "{r}:u", "10");
    ok(&mut c, &["QUOTA.CHARGE", "{r}:b", "1"]);
    assert_eq!(run_once(&redis, db, &["{r}:u"]).0, Some(0));
    for _ in 0..400 {
        ok(&mut c, &["QUOTA.CHARGE", "{r}:b", "1"]);
    }
    ok(&mut c, &["WAIT", "1", "10000"]);
    // The replica's view of the group, once it has caught up with the master.
    let mut rc = replica.conn();
    let deadline = Instant::now() + Duration::from_secs(10);
    while int(&ok(&mut rc, &["XLEN", "{r}:u"])) != int(&ok(&mut c, &["XLEN", "{r}:u"])) {
        assert!(Instant::now() < deadline, "replica did not catch up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let groups = items(&ok(&mut rc, &["XINFO", "GROUPS", "{r}:u"]));
    let g = items(&groups[0]);
    let pos = g
        .iter()
        .position(|v| matches!(v, redis::Value::BulkString(b) if b == b"entries-read"))
        .unwrap();
    let known = !matches!(g[pos + 1], redis::Value::Nil);

    let (code, out, _) = reconcile_out(&on_replica, db);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("is a replica"), "{out}");
    // Never a definite loss from a replica: its counters can lag the master's.
    assert!(!out.contains("TRIMMED PAST THE GROUP"), "{out}");
    assert!(
        out.contains("stream {r}:u: loss check not possible: "),
        "{out}"
    );
    if known {
        assert!(out.contains("counters can lag the master's"), "{out}");
    } else {
        assert!(out.contains("XINFO GROUPS gives no entries-read"), "{out}");
        assert!(out.contains("replicas do not keep it"), "{out}");
    }
    assert!(
        out.contains("MISMATCH (loss check of {r}:u not possible, see below)")
            && last_line(&out).contains("Redis cannot tell whether they were lost"),
        "{out}"
    );
    // The master names the loss.
    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("TRIMMED PAST THE GROUP"), "{out}");
}

/// `run --stream` on a key of another type: a readable error naming the stream.
#[test]
fn run_names_a_stream_key_of_another_type() {
    use_module();
    let server = Server::start(&[]);
    let redis = format!("redis://127.0.0.1:{}/", server.port);
    let mut c = server.conn();
    ok(&mut c, &["SET", "{e}:u", "x"]);
    let db = server.dir.join("u.db");
    let (code, err) = run_once(&redis, db.to_str().unwrap(), &["{e}:u"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("stream {e}:u: the key holds another type, not a stream"),
        "{err}"
    );
    assert!(!err.contains("\"WRONGTYPE\""), "{err}");
}

/// `quota-export reconcile` with extra arguments: (exit status, stdout, stderr).
fn reconcile_with(redis: &str, db: &str, extra: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(EXPORTER)
        .args(["reconcile", "--redis", redis, "--db", db])
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The new-user reproduction: the exporter's group is created on a stream that does not
/// exist yet, the stream is then trimmed before the group's first read, and the exporter
/// catches up. The group is created with `ENTRIESREAD 0`, so Redis counts its reads
/// exactly and reconcile names the loss after catching up (Redis estimates the counter of a
/// group created without it, and would hide the loss). The same when the exporter first
/// starts on a stream already trimmed.
#[test]
fn reconcile_names_a_trim_before_the_groups_first_read() {
    let (server, redis, db) = server_and_db();
    let db = db.as_str();
    let mut c = server.conn();
    for (b, u) in [("{tr}:b", "{tr}:u"), ("{old}:b", "{old}:u")] {
        budget_logging_to(&mut c, b, "100000000", u, "10");
    }
    // The group on a stream that does not exist yet: created empty, with a warning.
    let (code, err) = run_once(&redis, db, &["{tr}:u"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("warning: stream {tr}:u did not exist") && err.contains("--stream"),
        "{err}"
    );
    for _ in 0..400 {
        ok(&mut c, &["QUOTA.CHARGE", "{tr}:b", "1"]);
        ok(&mut c, &["QUOTA.CHARGE", "{old}:b", "1"]);
    }
    let kept_tr = int(&ok(&mut c, &["XLEN", "{tr}:u"]));
    let kept_old = int(&ok(&mut c, &["XLEN", "{old}:u"]));
    assert!(kept_tr < 400 && kept_old < 400, "{kept_tr} {kept_old}");
    let (code, err) = run_once(&redis, db, &["{tr}:u", "{old}:u"]);
    assert_eq!(code, Some(0), "{err}");
    // An existing stream: no warning.
    assert!(!err.contains("{old}:u did not exist"), "{err}");

    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!(code, Some(1), "{out}");
    for (u, kept) in [("{tr}:u", kept_tr), ("{old}:u", kept_old)] {
        assert!(
            out.contains(&format!(
                "stream {u}: TRIMMED PAST THE GROUP: {} entries",
                400 - kept
            )),
            "{out}"
        );
        assert!(
            out.contains(&format!("MISMATCH (entries of {u} lost before export)")),
            "{out}"
        );
    }
    assert!(!out.contains("not yet exported"), "{out}");
    assert!(
        last_line(&out).contains("deleted from the stream (trimmed or XDEL) before export"),
        "{out}"
    );
}

/// Entries read by the group but trimmed before they were stored (a consumer's own pending
/// entries read again at start, and another consumer's taken over with XAUTOCLAIM) are
/// recorded in quota_usage_rejects, and reconcile counts them as lost: with the entries
/// trimmed unread, the database and the losses add up to `used`.
#[test]
fn reconcile_counts_entries_deleted_while_pending() {
    let (server, redis, db) = server_and_db();
    deleted_while_pending(&server, &redis, &db);
}

/// The same on PostgreSQL (the record skips ids already stored: its own statement there).
#[test]
fn reconcile_counts_entries_deleted_while_pending_on_postgres() {
    let pg = Postgres::start();
    let (server, redis, _) = server_and_db();
    deleted_while_pending(&server, &redis, &pg.url());
}

fn deleted_while_pending(server: &Server, redis: &str, db: &str) {
    let redis = redis.to_string();
    let mut c = server.conn();
    budget_logging_to(&mut c, "{p}:b", "100000000", "{p}:u", "10");
    ok(&mut c, &["QUOTA.CHARGE", "{p}:b", "1"]);
    assert_eq!(run_once(&redis, db, &["{p}:u"]).0, Some(0));
    for _ in 0..5 {
        ok(&mut c, &["QUOTA.CHARGE", "{p}:b", "1"]);
    }
    // c1 reads 3 and c2 reads 2, neither stores them; then they are trimmed.
    for (consumer, n) in [("c1", "3"), ("c2", "2")] {
        let _ = ok(
            &mut c,
            &[
                "XREADGROUP",
                "GROUP",
                "quota-export",
                consumer,
                "COUNT",
                n,
                "STREAMS",
                "{p}:u",
                ">",
            ],
        );
    }
    for _ in 0..400 {
        ok(&mut c, &["QUOTA.CHARGE", "{p}:b", "1"]);
    }
    let kept = int(&ok(&mut c, &["XLEN", "{p}:u"]));
    let out = Command::new(EXPORTER)
        .args(["run", "--redis", &redis, "--db", db, "--once"])
        .args([
            "--stream",
            "{p}:u",
            "--consumer",
            "c1",
            "--claim-idle-ms",
            "0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("deleted (trimmed or XDEL) before export"),
        "{err}"
    );

    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("stream {p}:u: DELETED WHILE PENDING: 5 entries were read"),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "stream {{p}}:u: TRIMMED PAST THE GROUP: {} entries",
            400 - kept
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "database: {} usage rows, 0 malformed entries skipped, 5 entries deleted while pending",
            1 + kept
        )),
        "{out}"
    );
    // 1 + kept stored, 5 lost pending, 400 - kept lost unread: 406 charged in all.
    let info = items(&ok(&mut c, &["QUOTA.INFO", "{p}:b"]));
    let used = info
        .iter()
        .position(|v| matches!(v, redis::Value::BulkString(b) if b == b"used"))
        .map(|i| int(&info[i + 1]))
        .unwrap();
    assert_eq!(used, 406);
    assert!(
        out.contains("MISMATCH (entries of {p}:u lost before export)"),
        "{out}"
    );
}

/// Redis' read counter reset (`XGROUP SETID` without `ENTRIESREAD`): the database alone
/// shows that nothing is missing, so reconcile is OK. After an `XDEL` the group has read past
/// and a trim, Redis' estimated counter hides the trim; the database lacks the entries, and
/// reconcile fails saying the loss cannot be ruled out (in every later period too). A wrong
/// `--group` says so on the closing line.
#[test]
fn reconcile_falls_back_on_the_database_when_redis_cannot_count() {
    let (server, redis, db) = server_and_db();
    let db = db.as_str();
    let mut c = server.conn();
    ok(
        &mut c,
        &["QUOTA.SET", "{k}:b", "LIMIT", "100", "STREAM", "{k}:u"],
    );
    ok(&mut c, &["QUOTA.CHARGE", "{k}:b", "7"]);
    assert_eq!(run_once(&redis, db, &["{k}:u"]).0, Some(0));
    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!((code, last_line(&out)), (Some(0), "reconcile: OK"), "{out}");
    ok(&mut c, &["XGROUP", "SETID", "{k}:u", "quota-export", "$"]);
    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!((code, last_line(&out)), (Some(0), "reconcile: OK"), "{out}");

    let (code, out, _) = reconcile_with(&redis, db, &["--group", "nogroup"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        last_line(&out).contains("no consumer group \"nogroup\" on 1 stream(s)"),
        "{out}"
    );

    // The new user's reproduction: an XDEL the group reads past, and a trim (a server with
    // the test clock, for the period).
    drop(c);
    drop(server);
    let server = Server::start_with_module_args(&[], &["test-clock", "yes"]);
    let redis = format!("redis://127.0.0.1:{}/", server.port);
    let mut c = server.conn();
    let db = server.dir.join("x.db");
    let db = db.to_str().unwrap();
    ok(
        &mut c,
        &[
            "QUOTA.SET",
            "{x}:b",
            "LIMIT",
            "1000000",
            "PERIOD",
            "MINUTE",
            "STREAM",
            "{x}:u",
            "STREAMMAXLEN",
            "10",
            "AT",
            &T.to_string(),
        ],
    );
    let charge = |c: &mut redis::Connection, n: i64, at: i64| {
        for _ in 0..n {
            ok(c, &["QUOTA.CHARGE", "{x}:b", "1", "AT", &at.to_string()]);
        }
    };
    assert_eq!(run_once(&redis, db, &["{x}:u"]).0, Some(0));
    charge(&mut c, 5, T);
    assert_eq!(run_once(&redis, db, &["{x}:u"]).0, Some(0));
    charge(&mut c, 600, T);
    let newest = items(&ok(&mut c, &["XREVRANGE", "{x}:u", "+", "-", "COUNT", "1"]));
    let newest = text(&items(&newest[0])[0]);
    assert_eq!(int(&ok(&mut c, &["XDEL", "{x}:u", &newest])), 1);
    charge(&mut c, 2, T);
    let kept = int(&ok(&mut c, &["XLEN", "{x}:u"]));
    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("stream {x}:u: TRIMMED PAST THE GROUP: some entries"),
        "{out}"
    );
    assert_eq!(run_once(&redis, db, &["{x}:u"]).0, Some(0));
    // Lost: 607 charged, 5 + kept stored (the XDEL'd one among the lost).
    let missing = 607 - 5 - kept;
    for at in [T, T + 60_000] {
        if at > T {
            charge(&mut c, 1, at);
            assert_eq!(run_once(&redis, db, &["{x}:u"]).0, Some(0));
        }
        let (code, out, _) = reconcile_out(&redis, db);
        assert_eq!(code, Some(1), "{out}");
        assert!(
            out.contains(
                "stream {x}:u: loss check not possible: entries were deleted from {x}:u with XDEL"
            ),
            "{out}"
        );
        assert!(
            out.contains(&format!("the database lacks {missing} of the entries")),
            "{out}"
        );
        assert!(
            last_line(&out).contains("the database lacks entries the stream received"),
            "{out}"
        );
    }
}

/// Neither a group re-created (reading again what the database holds) nor entries stored
/// but not acknowledged before they were trimmed count as lost; a budget key that holds
/// another type now is listed, not an error.
#[test]
fn reconcile_does_not_call_stored_entries_lost() {
    let (server, redis, db) = server_and_db();
    let db = db.as_str();
    let mut c = server.conn();
    budget_logging_to(&mut c, "{g}:b", "100000000", "{g}:u", "10");
    // Exported as it comes: nothing lost, and the stream keeps only the last ~10.
    for _ in 0..30 {
        for _ in 0..10 {
            ok(&mut c, &["QUOTA.CHARGE", "{g}:b", "1"]);
        }
        assert_eq!(run_once(&redis, db, &["{g}:u"]).0, Some(0));
    }
    assert!(int(&ok(&mut c, &["XLEN", "{g}:u"])) < 300);
    ok(&mut c, &["XGROUP", "DESTROY", "{g}:u", "quota-export"]);
    assert_eq!(run_once(&redis, db, &["{g}:u"]).0, Some(0));
    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!((code, last_line(&out)), (Some(0), "reconcile: OK"), "{out}");

    // Stored, but the XACK refused (an ACL without it): pending; then trimmed away.
    budget_logging_to(&mut c, "{d}:b", "1000000", "{d}:u", "10");
    for _ in 0..30 {
        ok(&mut c, &["QUOTA.CHARGE", "{d}:b", "1"]);
    }
    ok(
        &mut c,
        &[
            "ACL", "SETUSER", "noack", "on", ">pw", "~*", "+@all", "-xack",
        ],
    );
    let noack = format!("redis://noack:pw@127.0.0.1:{}/", server.port);
    let out = Command::new(EXPORTER)
        .args(["run", "--redis", &noack, "--db", db, "--once"])
        .args(["--stream", "{d}:u", "--consumer", "c1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("stream {d}:u: "), "{err}");
    ok(&mut c, &["XTRIM", "{d}:u", "MAXLEN", "0"]);
    let out = Command::new(EXPORTER)
        .args(["run", "--redis", &redis, "--db", db, "--once"])
        .args(["--stream", "{d}:u", "--consumer", "c1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        !err.contains("deleted (trimmed or XDEL) before export"),
        "{err}"
    );
    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!((code, last_line(&out)), (Some(0), "reconcile: OK"), "{out}");
    assert!(out.contains("0 entries deleted while pending"), "{out}");

    ok(&mut c, &["DEL", "{d}:b"]);
    ok(&mut c, &["SET", "{d}:b", "x"]);
    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("gone (the key holds another type now)"),
        "{out}"
    );
}

/// Bad command lines and targets: empty names and a zero batch are refused before anything
/// is created; a directory, a file that is not SQLite, an unreachable Redis or PostgreSQL
/// give errors naming the target, with the password hidden.
#[test]
fn run_and_reconcile_name_bad_arguments_and_targets() {
    let (server, redis, db) = server_and_db();
    let db = db.as_str();
    let mut c = server.conn();
    for bad in [
        &["--stream", ""][..],
        &["--stream", "{x}:u", "--group", ""],
        &["--stream", "{x}:u", "--consumer", ""],
        &["--stream", "{x}:u", "--batch", "0"],
        &["--stream", "{x}:u", "--batch", "-1"],
    ] {
        let out = Command::new(EXPORTER)
            .args(["run", "--redis", &redis, "--db", db, "--once"])
            .args(bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert!(
            err.contains("invalid value")
                || err.contains("a value is required")
                || err.contains("unexpected argument"),
            "{bad:?}: {err}"
        );
    }
    assert_eq!(int(&ok(&mut c, &["EXISTS", "{x}:u", ""])), 0);
    assert!(!Path::new(db).exists());

    let dir = server.dir.to_str().unwrap();
    let (code, err) = run_once(&redis, dir, &["{x}:u"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!("database {dir}: is a directory")),
        "{err}"
    );
    let (code, _, err) = reconcile_out(&redis, dir);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!("database {dir}: is a directory")),
        "{err}"
    );

    let junk = server.dir.join("junk.db");
    std::fs::write(&junk, b"this is not a database, just some bytes in a file").unwrap();
    let junk = junk.to_str().unwrap();
    let (code, _, err) = reconcile_out(&redis, junk);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(&format!("database {junk}: ")), "{err}");
    let (code, err) = run_once(&redis, junk, &["{x}:u"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(&format!("database {junk}: ")), "{err}");

    let closed = free_addr();
    let unreachable = format!("redis://u:secret@{closed}/");
    let (code, err) = run_once(&unreachable, db, &["{x}:u"]);
    assert_eq!(code, Some(2), "{err}");
    let named = format!("redis redis://u:***@{closed}/: ");
    assert!(err.contains(&named) && !err.contains("secret"), "{err}");
    assert_eq!(run_once(&redis, db, &["{x}:u"]).0, Some(0));
    let (code, _, err) = reconcile_out(&unreachable, db);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(&named) && !err.contains("secret"), "{err}");
    let pg = format!("postgres://u:secret@{closed}/x");
    let (code, _, err) = reconcile_out(&redis, &pg);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "database postgres://u:***@{closed}/x: error connecting"
        )) && !err.contains("secret"),
        "{err}"
    );

    // Options that would block forever or that Redis refuses, and targets that are not a
    // SQLite path or a postgres:// URL: refused before anything is created.
    let fresh = server.dir.join("fresh.db");
    let fresh = fresh.to_str().unwrap();
    for bad in [
        &["--block-ms", "0"][..],
        &["--claim-idle-ms", "18446744073709551615"],
        &["--timeout-ms", "0"],
    ] {
        let out = Command::new(EXPORTER)
            .args([
                "run", "--redis", &redis, "--db", fresh, "--stream", "{y}:u", "--once",
            ])
            .args(bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert!(err.contains("invalid value"), "{bad:?}: {err}");
    }
    assert!(!Path::new(fresh).exists());
    assert_eq!(int(&ok(&mut c, &["EXISTS", "{y}:u"])), 0);
    let conninfo = "host=127.0.0.1 dbname=q user=q password=pgSecret9";
    for target in [conninfo, "mysql://u:pw9@h/db"] {
        let (code, err) = run_once(&redis, target, &["{y}:u"]);
        assert_eq!(code, Some(2), "{err}");
        assert!(!err.contains("pgSecret9") && !err.contains("pw9"), "{err}");
        assert!(!Path::new(target).exists());
    }
    let (_, _, err) = reconcile_out(
        &redis,
        &format!("postgres://{closed}/x?user=u&password=pgSecret9"),
    );
    assert!(
        err.contains("password=***") && !err.contains("pgSecret9"),
        "{err}"
    );
    let (_, _, err) = reconcile_out(&format!("u:secret@{closed}"), db);
    assert!(!err.contains("secret"), "{err}");

    // A server that accepts and never answers: an error after --timeout-ms, not a hang.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("redis://{}/", silent.local_addr().unwrap());
    let mut cmd = Command::new(EXPORTER);
    cmd.args([
        "reconcile",
        "--redis",
        &silent_url,
        "--db",
        db,
        "--timeout-ms",
        "300",
    ]);
    let (status, err) = exits_within_a_minute(
        &mut cmd,
        "reconcile against a silent server did not give up",
    );
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("redis {silent_url}: ")), "{err}");
}

/// Reconcile while an exporter keeps exporting and charges keep coming: an earlier loss on
/// one stream is reported every time (never an OK), and the other stream, which lost
/// nothing, is never said to have lost anything.
#[test]
fn reconcile_under_live_traffic_neither_misses_nor_invents_a_loss() {
    let (server, redis, db) = server_and_db();
    let db = db.as_str();
    let mut c = server.conn();
    for (b, u) in [("{lv}:b", "{lv}:u"), ("{ok}:b", "{ok}:u")] {
        budget_logging_to(&mut c, b, "1000000000", u, "0");
        ok(&mut c, &["QUOTA.CHARGE", b, "1"]);
    }
    assert_eq!(run_once(&redis, db, &["{lv}:u", "{ok}:u"]).0, Some(0));
    // 5 more on {lv}:u, of which the first 3 are trimmed unread.
    for _ in 0..5 {
        ok(&mut c, &["QUOTA.CHARGE", "{lv}:b", "1"]);
    }
    let unread = items(&ok(&mut c, &["XRANGE", "{lv}:u", "-", "+"]));
    let fourth = text(&items(&unread[4])[0]);
    assert_eq!(int(&ok(&mut c, &["XTRIM", "{lv}:u", "MINID", &fourth])), 4);
    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("stream {lv}:u: TRIMMED PAST THE GROUP: 3 entries"),
        "{out}"
    );

    let log = server.dir.join("live.log");
    let mut run = spawn(
        Command::new(EXPORTER).args([
            "run",
            "--redis",
            &redis,
            "--db",
            db,
            "--stream",
            "{lv}:u",
            "--stream",
            "{ok}:u",
            "--batch",
            "50",
            "--block-ms",
            "20",
        ]),
        &log,
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let charging = {
        let stop = stop.clone();
        let mut c = server.conn();
        std::thread::spawn(move || {
            let mut n = 0u64;
            // Steady traffic the exporter keeps up with (~2 000 charges/s).
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut p = redis::pipe();
                for i in 0..10 {
                    let key = if i % 2 == 0 { "{lv}:b" } else { "{ok}:b" };
                    p.cmd("QUOTA.CHARGE").arg(key).arg(1).ignore();
                }
                let () = p.query(&mut c).unwrap();
                n += 10;
                std::thread::sleep(Duration::from_millis(5));
            }
            n
        })
    };
    for _ in 0..8 {
        let (code, out, err) = reconcile_out(&redis, db);
        assert_eq!(code, Some(1), "{out}{err}");
        assert!(
            out.contains("stream {lv}:u: TRIMMED PAST THE GROUP: ")
                || out.contains("stream {lv}:u: loss check not possible: "),
            "{out}"
        );
        assert!(!out.contains("stream {ok}:u: TRIMMED"), "{out}");
        assert!(!out.contains("stream {ok}:u: loss check"), "{out}");
        assert!(!out.contains("{ok}:u: DELETED"), "{out}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let charged = charging.join().unwrap();
    assert!(charged > 0);
    // Caught up and quiet: the loss exactly, and {ok}:b matching.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, out, _) = reconcile_out(&redis, db);
        assert_eq!(code, Some(1), "{out}");
        if !out.contains("not yet exported") {
            assert!(
                out.contains("stream {lv}:u: TRIMMED PAST THE GROUP: 3 entries"),
                "{out}"
            );
            assert!(
                out.lines()
                    .any(|l| l.starts_with("{ok}:b ") && l.ends_with(" ok")),
                "{out}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the exporter did not catch up: {out}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = run.kill();
    let _ = run.wait();
}

/// A stream of which nothing reached the database is checked when reconcile is given it
/// (`--stream`, as run's); a stream deleted and re-created (its earlier rows in the
/// database) still has its new loss reported.
#[test]
fn reconcile_checks_named_streams_and_re_created_ones() {
    let (server, redis, db) = server_and_db();
    let db = db.as_str();
    let mut c = server.conn();
    for (b, u) in [("{s3a}:b", "{s3a}:u"), ("{s3b}:b", "{s3b}:u")] {
        budget_logging_to(&mut c, b, "1000000", u, "0");
    }
    assert_eq!(run_once(&redis, db, &["{s3a}:u", "{s3b}:u"]).0, Some(0));
    for _ in 0..5 {
        ok(&mut c, &["QUOTA.CHARGE", "{s3a}:b", "1"]);
        ok(&mut c, &["QUOTA.CHARGE", "{s3b}:b", "1"]);
    }
    ok(&mut c, &["XTRIM", "{s3b}:u", "MAXLEN", "0"]);
    assert_eq!(run_once(&redis, db, &["{s3a}:u", "{s3b}:u"]).0, Some(0));
    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!((code, last_line(&out)), (Some(0), "reconcile: OK"), "{out}");
    let (code, out, _) =
        reconcile_with(&redis, db, &["--stream", "{s3a}:u", "--stream", "{s3b}:u"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("stream {s3b}:u: TRIMMED PAST THE GROUP: 5 entries"),
        "{out}"
    );

    budget_logging_to(&mut c, "{dm}:b", "1000000", "{dm}:u", "0");
    for _ in 0..30 {
        ok(&mut c, &["QUOTA.CHARGE", "{dm}:b", "1"]);
    }
    assert_eq!(run_once(&redis, db, &["{dm}:u"]).0, Some(0));
    ok(&mut c, &["DEL", "{dm}:u"]);
    for _ in 0..10 {
        ok(&mut c, &["QUOTA.CHARGE", "{dm}:b", "1"]);
    }
    ok(&mut c, &["XTRIM", "{dm}:u", "MAXLEN", "5"]);
    assert_eq!(run_once(&redis, db, &["{dm}:u"]).0, Some(0));
    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("stream {dm}:u: TRIMMED PAST THE GROUP: 5 entries"),
        "{out}"
    );
}

/// Targets that would lose what they acknowledge or leak a password: in-memory SQLite, a
/// `postgres:` without `//`, a silent PostgreSQL (an error after --timeout-ms); the scheme in
/// upper case works like the lower-case one; blank names are refused.
#[test]
fn odd_targets_are_refused_and_passwords_never_printed() {
    let (server, redis, db) = server_and_db();
    let db = db.as_str();
    let dir = server.dir.to_str().unwrap().to_string();
    for target in [
        ":memory:",
        "sqlite://",
        "file::memory:",
        "file:x.db?mode=memory",
        "sqlite://file::memory:",
        "sqlite://file:",
        "sqlite:///:memory:",
    ] {
        let (code, err) = run_once(&redis, target, &["{o}:u"]);
        assert_eq!(code, Some(2), "{target}: {err}");
        assert!(err.contains("in-memory or URI database"), "{target}: {err}");
    }
    for target in [
        "postgres:u:Hunter2pw@127.0.0.1",
        "postgres:/u:Hunter2pw@127.0.0.1",
        "sqlite::memory:",
        "u:Hunter2pw@127.0.0.1:5432/db",
        "postgres//u:Hunter2pw@h/db",
        "sqlite://u:Hunter2pw@h/x.db",
    ] {
        let (code, err) = run_once(&redis, target, &["{o}:u"]);
        assert_eq!(code, Some(2), "{target}: {err}");
        assert!(!err.contains("Hunter2pw"), "{target}: {err}");
        assert!(!Path::new(target).exists());
    }
    let closed = free_addr();
    for scheme in ["POSTGRES", "PostgreSQL"] {
        let url = format!("{scheme}://u:Hunter2pw@{closed}/q1?connect_timeout=3");
        let (code, _, err) = reconcile_out(&redis, &url);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains("error connecting"), "{err}");
        assert!(!err.contains("Hunter2pw"), "{err}");
    }
    let upper = format!("SQLITE://{dir}/upper.db");
    assert_eq!(run_once(&redis, &upper, &["{o}:u"]).0, Some(0));
    assert!(server.dir.join("upper.db").is_file());
    for bad in [
        &["--stream", " "][..],
        &["--stream", "{o}:u", "--group", " "],
    ] {
        let out = Command::new(EXPORTER)
            .args(["run", "--redis", &redis, "--db", db, "--once"])
            .args(bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("must not be empty or blank"), "{err}");
    }

    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let pg = format!("postgres://u:pw@{}/x", silent.local_addr().unwrap());
    let mut cmd = Command::new(EXPORTER);
    cmd.args([
        "reconcile",
        "--redis",
        &redis,
        "--db",
        &pg,
        "--timeout-ms",
        "300",
    ]);
    let (status, err) = exits_within_a_minute(
        &mut cmd,
        "reconcile against a silent PostgreSQL did not give up",
    );
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("no answer within 300 ms"), "{err}");
}

/// Waits for `cmd` (run with stderr piped) to exit, at most a minute (then kills it and
/// fails with `hang`): its status and stderr.
fn exits_within_a_minute(cmd: &mut Command, hang: &str) -> (std::process::ExitStatus, String) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{hang}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status, err)
}

/// Entries pending at another consumer and then trimmed are lost at once, before any run
/// records them: reconcile says so (they are not "not exported yet").
#[test]
fn reconcile_sees_pending_entries_trimmed_before_any_run() {
    let (server, redis, db) = server_and_db();
    let db = db.as_str();
    let mut c = server.conn();
    budget_logging_to(&mut c, "{q3}:b", "1000000000", "{q3}:u", "0");
    assert_eq!(run_once(&redis, db, &["{q3}:u"]).0, Some(0));
    for _ in 0..50 {
        ok(&mut c, &["QUOTA.CHARGE", "{q3}:b", "1"]);
    }
    let _ = ok(
        &mut c,
        &[
            "XREADGROUP",
            "GROUP",
            "quota-export",
            "ghost",
            "COUNT",
            "50",
            "STREAMS",
            "{q3}:u",
            ">",
        ],
    );
    for _ in 0..50 {
        ok(&mut c, &["QUOTA.CHARGE", "{q3}:b", "2"]);
    }
    let out = Command::new(EXPORTER)
        .args([
            "run", "--redis", &redis, "--db", db, "--once", "--stream", "{q3}:u",
        ])
        .args(["--consumer", "live", "--claim-idle-ms", "600000"])
        .output()
        .unwrap();
    assert!(out.status.success());
    ok(&mut c, &["XTRIM", "{q3}:u", "MAXLEN", "50"]);
    let (code, out, _) = reconcile_with(&redis, db, &["--stream", "{q3}:u"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("stream {q3}:u: DELETED WHILE PENDING: 50 entries"),
        "{out}"
    );
    assert!(!out.contains("not yet exported"), "{out}");
    assert!(
        last_line(&out).contains("deleted from the stream (trimmed or XDEL) before export"),
        "{out}"
    );
}

/// After an XDEL of entries already stored, entries not exported yet are just that: no
/// possible loss (the database holds every entry up to the group's position).
#[test]
fn reconcile_after_xdel_does_not_call_unread_entries_lost() {
    let (server, redis, db) = server_and_db();
    let db = db.as_str();
    let mut c = server.conn();
    budget_logging_to(&mut c, "{k2}:b", "100000000", "{k2}:u", "0");
    for _ in 0..20 {
        ok(&mut c, &["QUOTA.CHARGE", "{k2}:b", "1"]);
    }
    assert_eq!(run_once(&redis, db, &["{k2}:u"]).0, Some(0));
    let all = items(&ok(&mut c, &["XRANGE", "{k2}:u", "-", "+"]));
    for i in [3, 19] {
        let id = text(&items(&all[i])[0]);
        assert_eq!(int(&ok(&mut c, &["XDEL", "{k2}:u", &id])), 1);
    }
    for _ in 0..5 {
        ok(&mut c, &["QUOTA.CHARGE", "{k2}:b", "1"]);
    }
    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("stream {k2}:u: not yet exported: 5 unread"),
        "{out}"
    );
    assert!(
        !out.contains("loss check") && !out.contains("TRIMMED"),
        "{out}"
    );
    assert_eq!(
        last_line(&out),
        "reconcile: FAILED (1 budget key(s) do not match; some entries are not exported yet)",
        "{out}"
    );
    assert_eq!(run_once(&redis, db, &["{k2}:u"]).0, Some(0));
    let (code, out, _) = reconcile_out(&redis, db);
    assert_eq!((code, last_line(&out)), (Some(0), "reconcile: OK"), "{out}");
}

/// `run` stopped and continued (SIGSTOP, SIGCONT: Ctrl-Z and fg, a paused container) goes on
/// exporting.
#[test]
fn run_goes_on_after_a_stop_and_continue() {
    let (server, redis, db) = server_and_db();
    let db = db.as_str();
    let mut c = server.conn();
    budget_logging_to(&mut c, "{w2}:b", "100000000", "{w2}:u", "0");
    ok(&mut c, &["QUOTA.CHARGE", "{w2}:b", "1"]);
    let log = server.dir.join("w2.log");
    let mut run = spawn(
        Command::new(EXPORTER).args([
            "run",
            "--redis",
            &redis,
            "--db",
            db,
            "--stream",
            "{w2}:u",
            "--block-ms",
            "200",
        ]),
        &log,
    );
    let pid = run.id().to_string();
    let exported = |n: i64| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (code, out, _) = reconcile_out(&redis, db);
            if code == Some(0) && out.contains(&format!("database: {n} usage rows")) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not exported: {out}\nrun's log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    exported(1);
    for _ in 0..3 {
        assert!(Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success());
        std::thread::sleep(Duration::from_millis(300));
        assert!(Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .unwrap()
            .success());
    }
    ok(&mut c, &["QUOTA.CHARGE", "{w2}:b", "1"]);
    exported(2);
    assert!(
        run.try_wait().unwrap().is_none(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    let _ = run.kill();
    let _ = run.wait();
}
