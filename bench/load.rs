//! Throughput workloads: each runs for a fixed time from several connections (one thread each)
//! at a given pipeline depth; the server-side cost comes from `INFO commandstats`, reset after
//! each workload's setup so it counts the timed part only.

use std::time::{Duration, Instant};

use redis::{Connection, ConnectionLike, Value};

use crate::server::{command_stats, Server};
use crate::Result;

/// Tenant keys each workload spreads its calls over.
pub const KEYS: usize = 64;
/// A budget limit no workload reaches: every call is granted (the write path is measured).
const BIG_LIMIT: i64 = 1_000_000_000_000_000;
/// Window limit no workload reaches: every call is admitted.
const WINDOW_LIMIT: i64 = 1_000_000_000;
/// The load workloads' sliding window: 1 s at the default precision (60 buckets of 16 ms), so
/// that within each run's first second every key's window fills and the rest of the run
/// measures a full window in steady state (a bucket opening and one leaving as time moves; the
/// ZSET likewise adds a member and trims the oldest). A 60 s window would stay nearly empty in
/// a 2 s run: 2–3 buckets, the module's best case.
const WINDOW_MS: i64 = 1_000;

/// The benchmark's Lua scripts, loaded with SCRIPT LOAD and called with EVALSHA.
pub struct Scripts {
    pub reserve: String,
    pub settle: String,
    pub rollback: String,
    pub window: String,
    pub daily: String,
    pub mreserve: String,
    pub msettle: String,
}

pub const RESERVE_LUA: &str = include_str!("lua/reserve.lua");
pub const SETTLE_LUA: &str = include_str!("lua/settle.lua");
pub const ROLLBACK_LUA: &str = include_str!("lua/rollback.lua");
pub const WINDOW_LUA: &str = include_str!("lua/window.lua");
pub const DAILY_LUA: &str = include_str!("lua/daily.lua");
pub const MRESERVE_LUA: &str = include_str!("lua/mreserve.lua");
pub const MSETTLE_LUA: &str = include_str!("lua/msettle.lua");

impl Scripts {
    pub fn load(con: &mut Connection) -> Result<Scripts> {
        let mut load = |src: &str| -> Result<String> {
            Ok(redis::cmd("SCRIPT").arg("LOAD").arg(src).query(con)?)
        };
        Ok(Scripts {
            reserve: load(RESERVE_LUA)?,
            settle: load(SETTLE_LUA)?,
            rollback: load(ROLLBACK_LUA)?,
            window: load(WINDOW_LUA)?,
            daily: load(DAILY_LUA)?,
            mreserve: load(MRESERVE_LUA)?,
            msettle: load(MSETTLE_LUA)?,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Incr,
    Hincrby,
    /// `FLOOR.WRITE` (bench/floor.rs): the module API calls of a write, no ledger.
    Floor,
    LuaReserve,
    LuaCycle,
    LuaRollback,
    LuaWindow,
    LuaDaily,
    Reserve,
    Cycle,
    /// The cycle with the budgets' usage log on (`QUOTA.SET ... STREAM`): one XADD per settle.
    CycleStream,
    Rollback,
    Charge,
    Window,
    /// The multi-limit workloads (issue 19): one request against [`MULTI_KEYS`] limits.
    LuaMReserve,
    LuaMCycle,
    /// `FLOOR.MWRITE` (bench/floor.rs): the module API calls of a granted 5-key MRESERVE, no
    /// ledger, with MRESERVE's argv (the tenant's [`MULTI_KEYS`] keys and amounts).
    MFloor,
    MReserve,
    MCycle,
}

impl Kind {
    pub const ALL: [Kind; 19] = [
        Kind::Incr,
        Kind::Hincrby,
        Kind::Floor,
        Kind::LuaReserve,
        Kind::LuaCycle,
        Kind::LuaRollback,
        Kind::LuaWindow,
        Kind::LuaDaily,
        Kind::Reserve,
        Kind::Cycle,
        Kind::CycleStream,
        Kind::Rollback,
        Kind::Charge,
        Kind::Window,
        Kind::LuaMReserve,
        Kind::LuaMCycle,
        Kind::MFloor,
        Kind::MReserve,
        Kind::MCycle,
    ];

    /// The workloads that need `QUOTA.MRESERVE` / `QUOTA.MSETTLE` in the module.
    pub fn needs_multi(self) -> bool {
        matches!(self, Kind::MReserve | Kind::MCycle)
    }

    /// The workloads that need the API-floor module (bench/floor.rs) loaded.
    pub fn needs_floor(self) -> bool {
        matches!(self, Kind::Floor | Kind::MFloor)
    }

    /// Measured again with the server on a CPU of its own: each module workload with a
    /// throughput figure worth comparing, next to its Lua twin.
    pub const PINNED: [Kind; 6] = [
        Kind::LuaReserve,
        Kind::Reserve,
        Kind::LuaCycle,
        Kind::Cycle,
        Kind::LuaWindow,
        Kind::Window,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Incr => "INCR",
            Kind::Hincrby => "HINCRBY",
            Kind::Floor => "module API floor (FLOOR.WRITE)",
            Kind::LuaReserve => "Lua reserve",
            Kind::LuaCycle => "Lua reserve+settle",
            Kind::LuaRollback => "Lua rollback",
            Kind::LuaWindow => "Lua window (ZSET)",
            Kind::LuaDaily => "Lua daily counter",
            Kind::Reserve => "QUOTA.RESERVE",
            Kind::Cycle => "QUOTA.RESERVE+SETTLE",
            Kind::CycleStream => "QUOTA.RESERVE+SETTLE, usage stream on",
            Kind::Rollback => "QUOTA.ROLLBACK",
            Kind::Charge => "QUOTA.CHARGE (PERIOD DAY)",
            Kind::Window => "QUOTA.WINDOW",
            Kind::LuaMReserve => "Lua mreserve (5 keys)",
            Kind::LuaMCycle => "Lua mreserve+msettle (5 keys)",
            Kind::MFloor => "module API floor, 5 keys (FLOOR.MWRITE)",
            Kind::MReserve => "QUOTA.MRESERVE (5 keys)",
            Kind::MCycle => "QUOTA.MRESERVE+MSETTLE (5 keys)",
        }
    }

    /// The commands whose `INFO commandstats` time is this workload's server cost.
    fn commands(self) -> &'static [&'static str] {
        match self {
            Kind::Incr => &["incr"],
            Kind::Hincrby => &["hincrby"],
            Kind::Floor => &["floor.write"],
            Kind::MFloor => &["floor.mwrite"],
            Kind::LuaReserve
            | Kind::LuaCycle
            | Kind::LuaRollback
            | Kind::LuaWindow
            | Kind::LuaDaily
            | Kind::LuaMReserve
            | Kind::LuaMCycle => &["evalsha"],
            Kind::Reserve => &["quota.reserve"],
            Kind::Cycle | Kind::CycleStream => &["quota.reserve", "quota.settle"],
            Kind::Rollback => &["quota.rollback"],
            Kind::Charge => &["quota.charge"],
            Kind::Window => &["quota.window"],
            Kind::MReserve => &["quota.mreserve"],
            Kind::MCycle => &["quota.mreserve", "quota.msettle"],
        }
    }

    /// What one operation is (a cycle is two calls).
    pub fn unit(self) -> &'static str {
        match self {
            Kind::LuaCycle | Kind::Cycle | Kind::CycleStream | Kind::LuaMCycle | Kind::MCycle => {
                "cycle"
            }
            _ => "call",
        }
    }

    /// Workloads that roll back reservations made (untimed) before the clock starts.
    fn needs_prefill(self) -> bool {
        matches!(self, Kind::LuaRollback | Kind::Rollback)
    }
}

/// Whether the server knows the command `name` (`COMMAND INFO` answers nil otherwise).
pub fn has_command(con: &mut Connection, name: &str) -> Result<bool> {
    let v: Value = redis::cmd("COMMAND").arg("INFO").arg(name).query(con)?;
    Ok(matches!(v, Value::Array(a) if a.first().is_some_and(|x| *x != Value::Nil)))
}

/// Adds a pass of a workload to `list`, keeping the best of each figure.
pub fn add_best(list: &mut Vec<Measure>, m: Measure) {
    match list
        .iter_mut()
        .find(|x| x.kind == m.kind && x.depth == m.depth)
    {
        Some(x) => x.merge(&m),
        None => list.push(m),
    }
}

/// One workload at one depth.
#[derive(Clone, Debug)]
pub struct Measure {
    pub kind: Kind,
    pub depth: usize,
    /// Operations completed (calls, or cycles for the cycle workloads).
    pub ops: u64,
    pub elapsed: Duration,
    /// Total server µs of the workload's commands from `INFO commandstats`.
    pub usec: u64,
    /// A rollback workload ran out of prefilled reservations before its time was up.
    pub exhausted: bool,
    /// CPU µs the server's main thread used meanwhile (`INFO cpu`: commands, networking,
    /// everything), and the client threads (`getrusage`, this process).
    pub server_cpu_us: u64,
    pub client_cpu_us: u64,
    /// Best throughput over the passes merged into this one.
    pub best_ops: f64,
    pub passes: usize,
}

impl Measure {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Server µs per operation (per cycle for the cycle workloads).
    pub fn usec_per_op(&self) -> f64 {
        self.usec as f64 / (self.ops.max(1)) as f64
    }

    /// CPU µs per operation of the server's main thread and of the clients.
    pub fn cpu_per_op(&self) -> (f64, f64) {
        let ops = self.ops.max(1) as f64;
        (
            self.server_cpu_us as f64 / ops,
            self.client_cpu_us as f64 / ops,
        )
    }

    pub fn best_ops_per_sec(&self) -> f64 {
        self.best_ops.max(self.ops_per_sec())
    }

    /// Keeps the least server time per operation and the most throughput of two passes.
    pub fn merge(&mut self, other: &Measure) {
        let best_ops = self.best_ops_per_sec().max(other.best_ops_per_sec());
        let passes = self.passes + other.passes;
        if other.usec_per_op() < self.usec_per_op() {
            *self = other.clone();
        }
        self.best_ops = best_ops;
        self.passes = passes;
    }
}

/// What a workload run needs besides its kind and depth.
pub struct Run<'a> {
    pub server: &'a Server,
    pub scripts: &'a Scripts,
    pub threads: usize,
    pub duration: Duration,
    /// For the rollback workloads: how many reservations each thread makes before the clock.
    pub prefill_per_thread: usize,
}

fn budget_key(k: usize) -> String {
    format!("bench:q:{k}")
}

fn tenant_hash(k: usize) -> String {
    format!("bench:t:{k}")
}

fn detail_key(id: &str) -> String {
    format!("quota_reserve:{id}")
}

/// Limits of one request in the multi-limit workloads: 3 budgets (key, team, org), an RPM and
/// a TPM window, all under the tenant's `{t<k>}` hash tag (one slot).
pub const MULTI_KEYS: usize = 5;
/// Budgets among them (the first three); the other two are windows.
pub const MULTI_BUDGETS: usize = 3;
/// What a request takes from each limit: its token estimate from the budgets and the TPM
/// window, 1 from the RPM window.
pub const MULTI_AMOUNTS: [i64; MULTI_KEYS] = [1000, 1000, 1000, 1, 1000];
/// What it settles at: fewer tokens than estimated (room given back), still one request.
pub const MULTI_ACTUALS: [i64; MULTI_KEYS] = [600, 600, 600, 1, 600];

/// One tenant's keys in the multi-limit workloads, encoded once.
pub struct MultiKeys {
    /// `QUOTA.MRESERVE`'s keys: 3 budgets, RPM, TPM (configured window keys).
    pub module: [Vec<u8>; MULTI_KEYS],
    /// mreserve.lua's keys after the detail hash: 3 budget hashes, then per window its ZSET
    /// and its {limit, window_ms, sum} hash.
    pub lua: [Vec<u8>; MULTI_BUDGETS + 2 * (MULTI_KEYS - MULTI_BUDGETS)],
    /// The detail hash's prefix (the id follows).
    pub detail: String,
    /// `FLOOR.MWRITE`'s keys (never created: it does not read them), as many as `module`.
    pub floor: [Vec<u8>; MULTI_KEYS],
}

impl MultiKeys {
    pub fn new(prefix: &str, k: usize) -> MultiKeys {
        let key = |s: &str| format!("{prefix}:{{t{k}}}:{s}").into_bytes();
        MultiKeys {
            module: [key("b0"), key("b1"), key("b2"), key("rpm"), key("tpm")],
            lua: [
                key("lb0"),
                key("lb1"),
                key("lb2"),
                key("lrpm"),
                key("lrpm:cfg"),
                key("ltpm"),
                key("ltpm:cfg"),
            ],
            detail: format!("quota_reserve:{{t{k}}}:"),
            floor: [key("f1"), key("f2"), key("f3"), key("f4"), key("f5")],
        }
    }

    /// The window keys (module) and window hashes (Lua).
    fn windows(&self) -> [(&[u8], &[u8]); MULTI_KEYS - MULTI_BUDGETS] {
        [
            (&self.module[3], &self.lua[4]),
            (&self.module[4], &self.lua[6]),
        ]
    }
}

/// The [`KEYS`] tenants' multi-limit keys of the load workloads.
fn multi_keys() -> &'static [MultiKeys] {
    static KEYS_: std::sync::OnceLock<Vec<MultiKeys>> = std::sync::OnceLock::new();
    KEYS_.get_or_init(|| (0..KEYS).map(|k| MultiKeys::new("bench", k)).collect())
}

/// A client id of exactly 16 bytes, unique per (thread, sequence).
fn client_id(thread: usize, n: u64) -> String {
    format!("r{thread:02}-{n:012}")
}

fn key_of(thread: usize, n: u64) -> usize {
    (n as usize).wrapping_add(thread.wrapping_mul(13)) % KEYS
}

/// Empties the server and creates what `kind` works on.
fn setup(con: &mut Connection, kind: Kind) -> Result<()> {
    redis::cmd("FLUSHALL").arg("SYNC").query::<()>(con)?;
    let mut p = redis::pipe();
    for k in 0..KEYS {
        match kind {
            Kind::LuaReserve | Kind::LuaCycle | Kind::LuaRollback => {
                p.cmd("HSET")
                    .arg(tenant_hash(k))
                    .arg("total")
                    .arg(BIG_LIMIT)
                    .arg("used")
                    .arg(0)
                    .arg("reserved")
                    .arg(0)
                    .ignore();
            }
            Kind::Reserve | Kind::Cycle | Kind::Rollback => {
                p.cmd("QUOTA.SET")
                    .arg(budget_key(k))
                    .arg("LIMIT")
                    .arg(BIG_LIMIT)
                    .arg("TTL")
                    .arg(3_600_000)
                    .ignore();
            }
            Kind::CycleStream => {
                // One stream per budget, trimmed as a deployment would (~100 000 entries).
                p.cmd("QUOTA.SET")
                    .arg(budget_key(k))
                    .arg("LIMIT")
                    .arg(BIG_LIMIT)
                    .arg("TTL")
                    .arg(3_600_000)
                    .arg("STREAM")
                    .arg(format!("bench:u:{k}"))
                    .arg("STREAMMAXLEN")
                    .arg(100_000)
                    .ignore();
            }
            Kind::Charge => {
                p.cmd("QUOTA.SET")
                    .arg(budget_key(k))
                    .arg("LIMIT")
                    .arg(BIG_LIMIT)
                    .arg("PERIOD")
                    .arg("DAY")
                    .ignore();
            }
            Kind::LuaMReserve | Kind::LuaMCycle => {
                let m = &multi_keys()[k];
                for b in &m.lua[..MULTI_BUDGETS] {
                    p.cmd("HSET")
                        .arg(b)
                        .arg("total")
                        .arg(BIG_LIMIT)
                        .arg("used")
                        .arg(0)
                        .arg("reserved")
                        .arg(0)
                        .ignore();
                }
                for (_, cfg) in m.windows() {
                    p.cmd("HSET")
                        .arg(cfg)
                        .arg("limit")
                        .arg(WINDOW_LIMIT)
                        .arg("window_ms")
                        .arg(WINDOW_MS)
                        .arg("sum")
                        .arg(0)
                        .ignore();
                }
            }
            Kind::MReserve | Kind::MCycle => {
                let m = &multi_keys()[k];
                for b in &m.module[..MULTI_BUDGETS] {
                    p.cmd("QUOTA.SET")
                        .arg(b)
                        .arg("LIMIT")
                        .arg(BIG_LIMIT)
                        .arg("TTL")
                        .arg(3_600_000)
                        .ignore();
                }
                for (w, _) in m.windows() {
                    p.cmd("QUOTA.SET")
                        .arg(w)
                        .arg("WINDOW")
                        .arg(WINDOW_LIMIT)
                        .arg(WINDOW_MS)
                        .ignore();
                }
            }
            _ => {}
        }
    }
    if p.cmd_iter().next().is_some() {
        p.query::<()>(con)?;
    }
    Ok(())
}

/// CPU µs (user + system) of the server's main thread so far, from `INFO cpu`.
fn server_cpu_us(con: &mut Connection) -> Result<u64> {
    let info: String = redis::cmd("INFO").arg("cpu").query(con)?;
    let mut total = 0.0;
    for line in info.lines() {
        if let Some((name, value)) = line.trim().split_once(':') {
            if name == "used_cpu_sys_main_thread" || name == "used_cpu_user_main_thread" {
                total += value.parse::<f64>()?;
            }
        }
    }
    Ok((total * 1e6) as u64)
}

/// CPU µs (user + system) of this process's threads so far.
fn client_cpu_us() -> u64 {
    // SAFETY: getrusage writes a plain struct we own.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

fn reset_stats(con: &mut Connection) -> Result<()> {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(con)
        .map_err(Into::into)
}

/// Runs `kind` at `depth` for `run.duration` and reads its server cost.
pub fn measure(run: &Run, kind: Kind, depth: usize) -> Result<Measure> {
    let mut con = run.server.connection()?;
    setup(&mut con, kind)?;
    let mut prefills: Vec<Vec<(usize, String)>> = Vec::new();
    if kind.needs_prefill() {
        for t in 0..run.threads {
            prefills.push(prefill(
                &mut con,
                run.scripts,
                kind,
                t,
                run.prefill_per_thread,
            )?);
        }
    } else {
        prefills.resize_with(run.threads, Vec::new);
    }
    reset_stats(&mut con)?;
    let client = run.server.client()?;
    let server_cpu_before = server_cpu_us(&mut con)?;
    let client_cpu_before = client_cpu_us();
    let start = Instant::now();
    let results: Vec<Result<(u64, Duration, bool)>> = std::thread::scope(|s| {
        let handles: Vec<_> = prefills
            .into_iter()
            .enumerate()
            .map(|(t, mut ids)| {
                let client = client.clone();
                s.spawn(move || -> Result<(u64, Duration, bool)> {
                    let mut con = client.get_connection()?;
                    let mut n: u64 = 0;
                    let mut ops: u64 = 0;
                    let mut exhausted = false;
                    let mut packed = Packed::default();
                    while start.elapsed() < run.duration {
                        let done = batch(
                            &mut con,
                            run.scripts,
                            kind,
                            t,
                            &mut n,
                            depth,
                            &mut ids,
                            &mut packed,
                        )?;
                        match done {
                            Some(done) => ops += done,
                            None => {
                                exhausted = true;
                                break;
                            }
                        }
                    }
                    if kind.unit() == "cycle" {
                        // Settle the last batch's reservations: every reserve counted has its
                        // settle, so the server's call count is exactly two per cycle.
                        let last = batch(
                            &mut con,
                            run.scripts,
                            kind,
                            t,
                            &mut n,
                            0,
                            &mut ids,
                            &mut packed,
                        )?;
                        ops += last.unwrap_or(0);
                    }
                    Ok((ops, start.elapsed(), exhausted))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect()
    });
    let mut ops = 0;
    let mut elapsed = Duration::ZERO;
    let mut exhausted = false;
    for r in results {
        let (o, e, x) = r?;
        ops += o;
        elapsed = elapsed.max(e);
        exhausted |= x;
    }
    let client_cpu = client_cpu_us().saturating_sub(client_cpu_before);
    let server_cpu = server_cpu_us(&mut con)?.saturating_sub(server_cpu_before);
    let mut calls = 0;
    let mut usec = 0;
    for name in kind.commands() {
        let (c, u) = command_stats(&mut con, name)?;
        calls += c;
        usec += u;
    }
    let per_op = if kind.unit() == "cycle" { 2 } else { 1 };
    if calls != ops * per_op {
        return Err(format!(
            "{}: the server counted {calls} calls for {ops} operations",
            kind.name()
        )
        .into());
    }
    Ok(Measure {
        kind,
        depth,
        ops,
        elapsed,
        usec,
        exhausted,
        server_cpu_us: server_cpu,
        client_cpu_us: client_cpu,
        best_ops: 0.0,
        passes: 1,
    })
}

/// Untimed: makes `count` reservations for thread `t` to roll back, as (key index, id).
fn prefill(
    con: &mut Connection,
    scripts: &Scripts,
    kind: Kind,
    t: usize,
    count: usize,
) -> Result<Vec<(usize, String)>> {
    const CHUNK: usize = 256;
    let mut out = Vec::with_capacity(count);
    let mut n: u64 = 0;
    while out.len() < count {
        let mut p = redis::pipe();
        let mut keys = Vec::with_capacity(CHUNK);
        for _ in 0..CHUNK.min(count - out.len()) {
            let k = key_of(t, n);
            let id = client_id(t, n);
            n += 1;
            if kind == Kind::LuaRollback {
                p.cmd("EVALSHA")
                    .arg(&scripts.reserve)
                    .arg(2)
                    .arg(tenant_hash(k))
                    .arg(detail_key(&id))
                    .arg(1);
            } else {
                p.cmd("QUOTA.RESERVE").arg(budget_key(k)).arg(1);
            }
            keys.push((k, id));
        }
        let replies: Vec<Value> = p.query(con)?;
        for ((k, id), v) in keys.into_iter().zip(replies) {
            if kind == Kind::LuaRollback {
                expect_int(&v, 1)?;
                out.push((k, id));
            } else {
                out.push((k, granted_id(&v)?));
            }
        }
    }
    // Popped from the back: roll back the oldest first, as a client would.
    out.reverse();
    Ok(out)
}

fn expect_int(v: &Value, want: i64) -> Result<()> {
    match v {
        Value::Int(n) if *n == want => Ok(()),
        other => Err(format!("unexpected reply {other:?} (wanted {want})").into()),
    }
}

/// The id of a granted `QUOTA.RESERVE` reply `[1, id, available, 0]`.
fn granted_id(v: &Value) -> Result<String> {
    if let Value::Array(items) = v {
        if let (Some(Value::Int(1)), Some(Value::BulkString(id))) = (items.first(), items.get(1)) {
            return Ok(String::from_utf8_lossy(id).into_owned());
        }
    }
    Err(format!("RESERVE not granted: {v:?}").into())
}

/// The first element of an array reply must be `want` (QUOTA.* replies).
fn expect_first(v: &Value, want: i64) -> Result<()> {
    if let Value::Array(items) = v {
        if let Some(Value::Int(n)) = items.first() {
            if *n == want {
                return Ok(());
            }
        }
    }
    Err(format!("unexpected reply {v:?}").into())
}

/// A pipeline encoded by hand (RESP), reused from batch to batch: the load generator spends
/// as little CPU per command as it can, so that what it measures is the server.
#[derive(Default)]
pub struct Packed {
    buf: Vec<u8>,
    count: usize,
}

impl Packed {
    fn clear(&mut self) {
        self.buf.clear();
        self.count = 0;
    }

    fn header(&mut self, prefix: u8, n: usize) {
        use std::io::Write;
        self.buf.push(prefix);
        let _ = write!(self.buf, "{n}\r\n");
    }

    fn bulk(&mut self, b: &[u8]) {
        self.header(b'$', b.len());
        self.buf.extend_from_slice(b);
        self.buf.extend_from_slice(b"\r\n");
    }

    fn int(&mut self, n: i64) {
        let mut tmp = [0u8; 24];
        let len = {
            use std::io::Write;
            let mut w = &mut tmp[..];
            let _ = write!(w, "{n}");
            24 - w.len()
        };
        self.bulk(&tmp[..len]);
    }

    /// Starts a command of `argc` arguments (name included).
    fn cmd(&mut self, argc: usize) -> &mut Self {
        self.header(b'*', argc);
        self.count += 1;
        self
    }

    fn send(&self, con: &mut Connection) -> Result<Vec<Value>> {
        Ok(con.req_packed_commands(&self.buf, 0, self.count)?)
    }
}

/// One pipelined batch of `depth` operations; `None` when a rollback workload ran out of ids.
/// `carried`: for the rollback workloads, the reservations made beforehand (popped from the
/// back); for the cycles, the reservations the previous batch made, settled by this one (a
/// batch of `depth` 0 settles the last ones).
#[allow(clippy::too_many_arguments)]
fn batch(
    con: &mut Connection,
    scripts: &Scripts,
    kind: Kind,
    t: usize,
    n: &mut u64,
    depth: usize,
    carried: &mut Vec<(usize, String)>,
    p: &mut Packed,
) -> Result<Option<u64>> {
    p.clear();
    let mut name = String::new();
    let mut key = |prefix: &str, k: usize| -> Vec<u8> {
        name.clear();
        use std::fmt::Write;
        let _ = write!(name, "{prefix}{k}");
        name.as_bytes().to_vec()
    };
    match kind {
        Kind::Incr
        | Kind::Hincrby
        | Kind::Floor
        | Kind::LuaWindow
        | Kind::LuaDaily
        | Kind::Charge
        | Kind::Window => {
            for _ in 0..depth {
                let k = key_of(t, *n);
                match kind {
                    Kind::Incr => {
                        let kb = key("bench:c:", k);
                        p.cmd(2).bulk(b"INCR");
                        p.bulk(&kb);
                    }
                    Kind::Hincrby => {
                        let kb = key("bench:t:", k);
                        p.cmd(4).bulk(b"HINCRBY");
                        p.bulk(&kb);
                        p.bulk(b"reserved");
                        p.int(1);
                    }
                    Kind::LuaWindow => {
                        let kb = key("bench:w:", k);
                        p.cmd(7).bulk(b"EVALSHA");
                        p.bulk(scripts.window.as_bytes());
                        p.int(1);
                        p.bulk(&kb);
                        p.int(WINDOW_LIMIT);
                        p.int(WINDOW_MS);
                        p.bulk(format!("{t}-{n}").as_bytes());
                    }
                    Kind::LuaDaily => {
                        let kb = key("bench:d:", k);
                        p.cmd(5).bulk(b"EVALSHA");
                        p.bulk(scripts.daily.as_bytes());
                        p.int(1);
                        p.bulk(&kb);
                        p.int(BIG_LIMIT);
                    }
                    Kind::Floor => {
                        let kb = key("bench:f:", k);
                        p.cmd(2).bulk(b"FLOOR.WRITE");
                        p.bulk(&kb);
                    }
                    Kind::Window => {
                        let kb = key("bench:qw:", k);
                        p.cmd(4).bulk(b"QUOTA.WINDOW");
                        p.bulk(&kb);
                        p.int(WINDOW_LIMIT);
                        p.int(WINDOW_MS);
                    }
                    _ => {
                        let kb = key("bench:q:", k);
                        p.cmd(3).bulk(b"QUOTA.CHARGE");
                        p.bulk(&kb);
                        p.int(1);
                    }
                }
                *n += 1;
            }
            let replies = p.send(con)?;
            for v in &replies {
                match kind {
                    Kind::LuaWindow | Kind::LuaDaily => expect_int(v, 1)?,
                    Kind::Charge | Kind::Window | Kind::Floor => expect_first(v, 1)?,
                    Kind::Incr | Kind::Hincrby if !matches!(v, Value::Int(_)) => {
                        return Err(format!("unexpected reply {v:?}").into());
                    }
                    _ => {}
                }
            }
        }
        Kind::LuaReserve | Kind::Reserve => {
            for _ in 0..depth {
                queue_reserve(p, scripts, kind == Kind::LuaReserve, t, n);
            }
            for v in &p.send(con)? {
                if kind == Kind::LuaReserve {
                    expect_int(v, 1)?;
                } else {
                    expect_first(v, 1)?;
                }
            }
        }
        Kind::LuaMReserve | Kind::MReserve | Kind::MFloor => {
            for _ in 0..depth {
                if kind == Kind::MFloor {
                    queue_mfloor(p, t, n);
                } else {
                    queue_mreserve(p, scripts, kind == Kind::LuaMReserve, t, n);
                }
            }
            for v in &p.send(con)? {
                expect_first(v, 1)?;
            }
        }
        Kind::LuaMCycle | Kind::MCycle => {
            // As the single-key cycle below: this batch settles the previous one's.
            let lua = kind == Kind::LuaMCycle;
            let settles = carried.len();
            for (k, id) in carried.iter() {
                queue_msettle(p, scripts, lua, *k, id);
            }
            carried.clear();
            let made: Vec<usize> = (0..depth)
                .map(|_| queue_mreserve(p, scripts, lua, t, n).0)
                .collect();
            let replies = p.send(con)?;
            let (settled, reserved) = replies.split_at(settles.min(replies.len()));
            for v in settled {
                expect_msettled(v)?;
            }
            for (k, v) in made.into_iter().zip(reserved) {
                // The Lua reply carries the client id as the module's does the generated one.
                carried.push((k, granted_id(v)?));
            }
            return Ok(Some(settles as u64));
        }
        Kind::LuaCycle | Kind::Cycle | Kind::CycleStream => {
            // One round trip per batch: settle what the previous batch reserved (with the ids
            // its replies returned), then make `depth` new reservations, as a gateway's
            // connection interleaves the settles of finished calls with new calls' reserves.
            let settles = carried.len();
            for (k, id) in carried.iter() {
                if kind == Kind::LuaCycle {
                    lua_call(p, &scripts.settle, &key("bench:t:", *k), id);
                } else {
                    p.cmd(4).bulk(b"QUOTA.SETTLE");
                    p.bulk(&key("bench:q:", *k));
                    p.bulk(id.as_bytes());
                    p.int(1);
                }
            }
            carried.clear();
            let made: Vec<(usize, String)> = (0..depth)
                .map(|_| queue_reserve(p, scripts, kind == Kind::LuaCycle, t, n))
                .collect();
            let replies = p.send(con)?;
            let (settled, reserved) = replies.split_at(settles.min(replies.len()));
            for v in settled {
                if kind == Kind::LuaCycle {
                    expect_int(v, 1)?;
                } else {
                    expect_settled(v)?;
                }
            }
            for ((k, id), v) in made.into_iter().zip(reserved) {
                if kind == Kind::LuaCycle {
                    expect_int(v, 1)?;
                    carried.push((k, id));
                } else {
                    carried.push((k, granted_id(v)?));
                }
            }
            return Ok(Some(settles as u64));
        }
        Kind::LuaRollback | Kind::Rollback => {
            if carried.len() < depth {
                return Ok(None);
            }
            for _ in 0..depth {
                let Some((k, id)) = carried.pop() else {
                    return Ok(None);
                };
                if kind == Kind::LuaRollback {
                    let kb = key("bench:t:", k);
                    p.cmd(5).bulk(b"EVALSHA");
                    p.bulk(scripts.rollback.as_bytes());
                    p.int(2);
                    p.bulk(&kb);
                    p.bulk(detail_key(&id).as_bytes());
                } else {
                    let kb = key("bench:q:", k);
                    p.cmd(3).bulk(b"QUOTA.ROLLBACK");
                    p.bulk(&kb);
                    p.bulk(id.as_bytes());
                }
            }
            for v in &p.send(con)? {
                if kind == Kind::LuaRollback {
                    expect_int(v, 1)?;
                } else {
                    expect_status(v, "rolledback")?;
                }
            }
        }
    }
    Ok(Some(depth as u64))
}

/// Queues thread `t`'s next reserve of 1 unit: the Lua script's (on `bench:t:<k>`, with the
/// client id) or `QUOTA.RESERVE` (on `bench:q:<k>`, generated id). Returns (key index, client id).
fn queue_reserve(
    p: &mut Packed,
    scripts: &Scripts,
    lua: bool,
    t: usize,
    n: &mut u64,
) -> (usize, String) {
    let k = key_of(t, *n);
    let id = client_id(t, *n);
    *n += 1;
    if lua {
        lua_call(p, &scripts.reserve, format!("bench:t:{k}").as_bytes(), &id);
    } else {
        p.cmd(3).bulk(b"QUOTA.RESERVE");
        p.bulk(format!("bench:q:{k}").as_bytes());
        p.int(1);
    }
    (k, id)
}

/// Queues thread `t`'s next multi-limit request ([`MULTI_AMOUNTS`] over a tenant's
/// [`MULTI_KEYS`] keys): mreserve.lua (client id) or `QUOTA.MRESERVE` (generated id). Returns
/// (tenant index, client id).
fn queue_mreserve(
    p: &mut Packed,
    scripts: &Scripts,
    lua: bool,
    t: usize,
    n: &mut u64,
) -> (usize, String) {
    let k = key_of(t, *n);
    let id = client_id(t, *n);
    *n += 1;
    let m = &multi_keys()[k];
    let call = (scripts.mreserve.as_str(), &b"QUOTA.MRESERVE"[..]);
    if lua {
        // ... ttl amounts..
        queue_multi_head(p, m, lua, call, &id, 1 + MULTI_KEYS);
        p.int(3600);
    } else {
        // ... amounts..
        queue_multi_head(p, m, lua, call, &id, MULTI_KEYS);
    }
    for a in MULTI_AMOUNTS {
        p.int(a);
    }
    (k, id)
}

/// Queues thread `t`'s next `FLOOR.MWRITE numkeys keys.. amounts..`: the argv of its
/// `QUOTA.MRESERVE` (as many keys and amounts) on the tenant's floor keys.
fn queue_mfloor(p: &mut Packed, t: usize, n: &mut u64) {
    let k = key_of(t, *n);
    *n += 1;
    let m = &multi_keys()[k];
    p.cmd(2 + 2 * MULTI_KEYS).bulk(b"FLOOR.MWRITE");
    p.int(MULTI_KEYS as i64);
    for key in &m.floor {
        p.bulk(key);
    }
    for a in MULTI_AMOUNTS {
        p.int(a);
    }
}

/// Queues the start of a multi-key call on `m`'s keys, `more` arguments to follow: with `lua`,
/// `EVALSHA sha numkeys detail keys.. nb nw id` (mreserve.lua, msettle.lua); else the module's
/// `name numkeys keys..`.
fn queue_multi_head(
    p: &mut Packed,
    m: &MultiKeys,
    lua: bool,
    (sha, name): (&str, &[u8]),
    id: &str,
    more: usize,
) {
    if !lua {
        p.cmd(2 + MULTI_KEYS + more).bulk(name);
        p.int(MULTI_KEYS as i64);
        for key in &m.module {
            p.bulk(key);
        }
        return;
    }
    p.cmd(3 + 1 + m.lua.len() + 3 + more).bulk(b"EVALSHA");
    p.bulk(sha.as_bytes());
    p.int(1 + m.lua.len() as i64);
    p.bulk(format!("{}{id}", m.detail).as_bytes());
    for key in &m.lua {
        p.bulk(key);
    }
    p.int(MULTI_BUDGETS as i64);
    p.int((MULTI_KEYS - MULTI_BUDGETS) as i64);
    p.bulk(id.as_bytes());
}

/// Queues the settle of tenant `k`'s reservation `id` at [`MULTI_ACTUALS`]: msettle.lua or
/// `QUOTA.MSETTLE`.
fn queue_msettle(p: &mut Packed, scripts: &Scripts, lua: bool, k: usize, id: &str) {
    let m = &multi_keys()[k];
    let call = (scripts.msettle.as_str(), &b"QUOTA.MSETTLE"[..]);
    if lua {
        // ... actuals..
        queue_multi_head(p, m, lua, call, id, MULTI_KEYS);
    } else {
        // ... id actuals..
        queue_multi_head(p, m, lua, call, id, 1 + MULTI_KEYS);
        p.bulk(id.as_bytes());
    }
    for a in MULTI_ACTUALS {
        p.int(a);
    }
}

/// An MSETTLE reply (module or Lua): one `[status, charged, value]` per key, the first (a
/// budget) `settled`.
fn expect_msettled(v: &Value) -> Result<()> {
    if let Value::Array(per_key) = v {
        if per_key.len() == MULTI_KEYS {
            if let Some(Value::Array(first)) = per_key.first() {
                match first.first() {
                    Some(Value::SimpleString(s)) if s == "settled" => return Ok(()),
                    Some(Value::BulkString(b)) if b == b"settled" => return Ok(()),
                    _ => {}
                }
            }
        }
    }
    Err(format!("unexpected MSETTLE reply {v:?}").into())
}

/// `EVALSHA sha 2 tenant quota_reserve:<id> 1`: the Lua reserve or settle of 1 unit.
fn lua_call(p: &mut Packed, sha: &str, tenant: &[u8], id: &str) {
    p.cmd(6).bulk(b"EVALSHA");
    p.bulk(sha.as_bytes());
    p.int(2);
    p.bulk(tenant);
    p.bulk(detail_key(id).as_bytes());
    p.int(1);
}

fn expect_settled(v: &Value) -> Result<()> {
    expect_status(v, "settled")
}

/// `[status, n, available]` replies of SETTLE and ROLLBACK.
fn expect_status(v: &Value, want: &str) -> Result<()> {
    if let Value::Array(items) = v {
        match items.first() {
            Some(Value::SimpleString(s)) if s == want => return Ok(()),
            Some(Value::Okay) if want == "OK" => return Ok(()),
            _ => {}
        }
    }
    Err(format!("unexpected reply {v:?} (wanted {want})").into())
}
