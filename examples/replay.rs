//! `make demo`: replays the Azure LLM inference trace 2023 through redis-quota and proves, at the
//! end, that the module's ledger matches what the clients settled, token for token.
//!
//! # Data
//!
//! `examples/data/azure-llm-inference-2023/` holds both CSVs of the trace (`conv`: a conversation
//! service, `code`: a coding service), columns `TIMESTAMP,ContextTokens,GeneratedTokens`.
//! Source: Azure/AzurePublicDataset, CC-BY 4.0. Attribution: Patel et al., "Splitwise: Efficient
//! generative LLM inference using phase splitting", ISCA 2024. The trace has no tenants and no
//! `max_tokens`: both are derived below, deterministically.
//!
//! # Rules
//!
//! * **Order.** The two files are merged by `TIMESTAMP` (fixed-width text, so text order is time
//!   order; ties: `conv` before `code`, then row order). That merged list is the trace order.
//! * **Tenants.** A request is row `r` (0-based, header excluded) of file `s` (`conv` or `code`);
//!   its tenant is `s-(r mod 4)`: eight tenants, `conv-0`..`conv-3` and `code-0`..`code-3`.
//! * **Demand.** A tenant's demand is the sum of `ContextTokens + GeneratedTokens` over its rows.
//! * **max_tokens (derived).** `max_tokens = max(16, next power of two ≥ GeneratedTokens)`: the
//!   completion cap a client would plausibly have asked for.
//! * **Reservation.** Each request reserves `ContextTokens + ceil(max_tokens × 1.2)`, then settles
//!   the real `ContextTokens + GeneratedTokens` (never more than it reserved).
//! * **Budgets.** `QUOTA.SET replay:<tenant> LIMIT n TTL 60000` with `n` as follows:
//!   - fully provisioned (`*-0`, `*-1`, `*-2`): `n = demand + 8 × largest reservation`. The 8 is
//!     the number of connections, so at most 8 reservations are in flight; these tenants are
//!     never denied, and the program checks that they were not.
//!   - under-provisioned: `conv-3` gets 50 % of its demand, `code-3` 80 %. They run out part
//!     way through the trace; later requests are denied unless they fit what is left.
//! * **Concurrency.** 8 threads, one connection each, take the next request from a shared index
//!   (trace order, no pacing: as fast as Redis answers) and run `QUOTA.RESERVE`, then — if
//!   granted — `QUOTA.SETTLE`. A denied request is counted and not settled.
//! * **Idempotent retries.** `conv-0` and `code-0` use their own ids (`conv-<row>`, `code-<row>`)
//!   and send every RESERVE and every SETTLE twice, as a client retrying after a lost reply
//!   would: the second RESERVE must return the same id and reserve nothing more, the second
//!   SETTLE must answer `duplicate` and charge nothing more. Other tenants use the ids the module
//!   generates (the RESERVE reply).
//!
//! # Checks (exit status 1 if any fails)
//!
//! Per tenant and overall: `used` from `QUOTA.INFO` equals the client's sum of settled tokens,
//! `reserved` and `pending` are 0, `used ≤ limit`; fully provisioned tenants had no denial; every
//! SETTLE answered `settled` and every retry behaved as above.
//!
//! # Server
//!
//! With `REDIS_URL` set, it uses that server (the module must be loaded there) and overwrites
//! the keys `replay:conv-0` .. `replay:code-3`. Otherwise it starts its own
//! `redis-server --port <free port> --loadmodule $QUOTA_MODULE --save '' --dir <temp dir>`
//! (`QUOTA_MODULE` defaults to `target/release/libredis_quota.so`) and stops it at the end.

// A demo client, not module code: the no-panic lints guard the module only.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::panic
)]

use std::collections::HashMap;
use std::error::Error;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// The trace, shipped with the example (never read from outside the repository).
const DATA_DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/data/azure-llm-inference-2023"
);
/// (service name, file) in tie-break order.
const SERVICES: [(&str, &str); 2] = [
    ("conv", "AzureLLMInferenceTrace_conv.csv"),
    ("code", "AzureLLMInferenceTrace_code.csv"),
];
const HEADER: &str = "TIMESTAMP,ContextTokens,GeneratedTokens";
const TENANTS_PER_SERVICE: usize = 4;
/// Connections, one per thread: also the most reservations in flight at once.
const THREADS: usize = 8;
/// Reservation TTL (ms) set on every budget: far longer than the run, so none expires.
const TTL_MS: u64 = 60_000;
const KEY_PREFIX: &str = "replay:";
const ATTRIBUTION: &str = "Data: Azure LLM inference trace 2023 (Azure/AzurePublicDataset, CC-BY 4.0) — \
     Patel et al., \"Splitwise: Efficient generative LLM inference using phase splitting\", ISCA 2024.";

/// How a tenant's limit is derived from its demand.
#[derive(Clone, Copy)]
enum Provision {
    /// Demand plus room for `THREADS` largest reservations in flight: never denied.
    Full,
    /// This percentage of the demand.
    Percent(u64),
}

/// Provisioning of tenant `s-i` (index `i` within its service `s`).
fn provision(service: usize, index: usize) -> Provision {
    match (SERVICES[service].0, index) {
        ("conv", 3) => Provision::Percent(50),
        ("code", 3) => Provision::Percent(80),
        _ => Provision::Full,
    }
}

/// Tenants that send their own ids and retry every command once.
fn uses_own_ids(index: usize) -> bool {
    index == 0
}

/// One row of the trace.
struct Request {
    timestamp: String,
    service: usize,
    row: usize,
    context: u64,
    generated: u64,
}

impl Request {
    fn tenant(&self) -> usize {
        self.service * TENANTS_PER_SERVICE + self.row % TENANTS_PER_SERVICE
    }

    /// Derived completion cap: the next power of two at or above GeneratedTokens, at least 16.
    fn max_tokens(&self) -> u64 {
        self.generated.next_power_of_two().max(16)
    }

    /// What the client reserves: ContextTokens + ceil(max_tokens × 1.2).
    fn reservation(&self) -> u64 {
        self.context + (self.max_tokens() * 6).div_ceil(5)
    }

    /// What the request really used.
    fn actual(&self) -> u64 {
        self.context + self.generated
    }
}

/// A tenant's setup, derived from the trace.
struct Tenant {
    name: String,
    key: String,
    provision: Provision,
    own_ids: bool,
    demand: u64,
    limit: u64,
}

/// What one thread observed for one tenant.
#[derive(Default, Clone)]
struct TenantStats {
    requests: u64,
    granted: u64,
    denied: u64,
    settled_tokens: u64,
}

/// What one thread observed.
#[derive(Default)]
struct Stats {
    tenants: Vec<TenantStats>,
    commands: u64,
    reserve_retries: u64,
    settle_duplicates: u64,
}

impl Stats {
    fn new(tenants: usize) -> Stats {
        Stats {
            tenants: vec![TenantStats::default(); tenants],
            ..Stats::default()
        }
    }

    fn merge(&mut self, other: Stats) {
        for (a, b) in self.tenants.iter_mut().zip(other.tenants) {
            a.requests += b.requests;
            a.granted += b.granted;
            a.denied += b.denied;
            a.settled_tokens += b.settled_tokens;
        }
        self.commands += other.commands;
        self.reserve_retries += other.reserve_retries;
        self.settle_duplicates += other.settle_duplicates;
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("replay: RECONCILIATION FAILED (see the lines marked MISMATCH above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("replay: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Loads, provisions, replays, reconciles. `Ok(false)` when a check failed. The server (when
/// started here) is stopped when this returns, whatever the outcome.
fn run() -> Result<bool> {
    let requests = load_trace(Path::new(DATA_DIR))?;
    let tenants = derive_tenants(&requests);

    let (url, _server, where_) = match std::env::var("REDIS_URL") {
        Ok(url) => (url.clone(), None, format!("REDIS_URL={url}")),
        Err(_) => {
            let server = Server::start(&module_path()?)?;
            let url = format!("redis://127.0.0.1:{}/", server.port);
            let where_ = format!(
                "own redis-server on 127.0.0.1:{} with {}",
                server.port,
                server.module.display()
            );
            (url, Some(server), where_)
        }
    };
    let client =
        redis::Client::open(url.as_str()).map_err(|e| format!("invalid Redis URL {url:?}: {e}"))?;
    let mut con = client
        .get_connection()
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;

    let per_service: Vec<usize> = (0..SERVICES.len())
        .map(|s| requests.iter().filter(|r| r.service == s).count())
        .collect();
    println!(
        "redis-quota replay: {} requests from the Azure LLM inference trace 2023 \
         (conv {} + code {}), {} tenants, {THREADS} connections",
        thousands(requests.len() as u64),
        thousands(per_service[0] as u64),
        thousands(per_service[1] as u64),
        tenants.len(),
    );
    println!("server: {where_}");
    println!();

    provision_budgets(&mut con, &tenants)?;

    let next = AtomicUsize::new(0);
    let started = Instant::now();
    let results: Vec<Result<Stats>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                scope.spawn(|| {
                    let result = worker(&client, &requests, &tenants, &next);
                    if result.is_err() {
                        // Stop the other threads: no request is left to take.
                        next.store(requests.len(), Ordering::Relaxed);
                    }
                    result
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a replay thread panicked".into()))
            })
            .collect()
    });
    let elapsed = started.elapsed();
    let mut stats = Stats::new(tenants.len());
    for r in results {
        stats.merge(r?);
    }

    print_table(&tenants, &stats);
    println!();
    let ok = reconcile(&mut con, &tenants, &stats)?;
    println!();
    let own: Vec<&str> = tenants
        .iter()
        .filter(|t| t.own_ids)
        .map(|t| t.name.as_str())
        .collect();
    println!(
        "idempotent retries ({}): {} RESERVE retries returned the same id and reserved nothing more; \
         {} SETTLE retries answered \"duplicate\" and charged nothing more",
        own.join(", "),
        thousands(stats.reserve_retries),
        thousands(stats.settle_duplicates),
    );
    let secs = elapsed.as_secs_f64().max(1e-9);
    println!(
        "throughput: {} requests in {secs:.2} s = {} requests/s; {} QUOTA.* commands = {} commands/s",
        thousands(requests.len() as u64),
        thousands((requests.len() as f64 / secs) as u64),
        thousands(stats.commands),
        thousands((stats.commands as f64 / secs) as u64),
    );
    println!("{ATTRIBUTION}");
    Ok(ok)
}

/// Reads both CSVs and merges them into trace order.
fn load_trace(dir: &Path) -> Result<Vec<Request>> {
    let mut all = Vec::new();
    for (service, (_, file)) in SERVICES.iter().enumerate() {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, h)) if h.trim() == HEADER => {}
            other => {
                return Err(format!(
                    "{}: expected header {HEADER:?}, found {:?}",
                    path.display(),
                    other.map(|(_, h)| h)
                )
                .into())
            }
        }
        let mut row = 0;
        for (n, line) in lines {
            if line.trim().is_empty() {
                continue;
            }
            let bad = |what: &str| format!("{}:{}: {what}: {line:?}", path.display(), n + 1);
            let fields: Vec<&str> = line.trim().split(',').collect();
            let [timestamp, context, generated] = fields[..] else {
                return Err(bad("expected 3 fields").into());
            };
            let context = context
                .parse()
                .map_err(|_| bad("ContextTokens is not a non-negative integer"))?;
            let generated = generated
                .parse()
                .map_err(|_| bad("GeneratedTokens is not a non-negative integer"))?;
            all.push(Request {
                timestamp: timestamp.to_string(),
                service,
                row,
                context,
                generated,
            });
            row += 1;
        }
    }
    all.sort_by(|a, b| {
        (a.timestamp.as_str(), a.service, a.row).cmp(&(b.timestamp.as_str(), b.service, b.row))
    });
    Ok(all)
}

/// Demand and limit of every tenant.
fn derive_tenants(requests: &[Request]) -> Vec<Tenant> {
    let count = SERVICES.len() * TENANTS_PER_SERVICE;
    let mut demand = vec![0u64; count];
    let mut largest = vec![0u64; count];
    for r in requests {
        demand[r.tenant()] += r.actual();
        largest[r.tenant()] = largest[r.tenant()].max(r.reservation());
    }
    (0..count)
        .map(|t| {
            let (service, index) = (t / TENANTS_PER_SERVICE, t % TENANTS_PER_SERVICE);
            let name = format!("{}-{index}", SERVICES[service].0);
            let provision = provision(service, index);
            let limit = match provision {
                Provision::Full => demand[t] + THREADS as u64 * largest[t],
                Provision::Percent(p) => demand[t] * p / 100,
            };
            Tenant {
                key: format!("{KEY_PREFIX}{name}"),
                name,
                provision,
                own_ids: uses_own_ids(index),
                demand: demand[t],
                limit,
            }
        })
        .collect()
}

/// Fresh budgets: DEL, then QUOTA.SET (which must create).
fn provision_budgets(con: &mut redis::Connection, tenants: &[Tenant]) -> Result<()> {
    for t in tenants {
        let _: i64 = redis::cmd("DEL")
            .arg(&t.key)
            .query(con)
            .map_err(|e| format!("DEL {}: {e}", t.key))?;
        let created: i64 = redis::cmd("QUOTA.SET")
            .arg(&t.key)
            .arg("LIMIT")
            .arg(t.limit)
            .arg("TTL")
            .arg(TTL_MS)
            .query(con)
            .map_err(|e| {
                format!(
                    "QUOTA.SET {} failed: {e} (is the redis-quota module loaded on this server?)",
                    t.key
                )
            })?;
        if created != 1 {
            return Err(format!("QUOTA.SET {} answered {created}, expected 1", t.key).into());
        }
    }
    Ok(())
}

/// One connection: takes requests in trace order from `next` until none are left.
fn worker(
    client: &redis::Client,
    requests: &[Request],
    tenants: &[Tenant],
    next: &AtomicUsize,
) -> Result<Stats> {
    let mut con = client
        .get_connection()
        .map_err(|e| format!("cannot open a replay connection: {e}"))?;
    let mut stats = Stats::new(tenants.len());
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(r) = requests.get(i) else {
            return Ok(stats);
        };
        let tenant = &tenants[r.tenant()];
        let key = tenant.key.as_str();
        let amount = r.reservation();
        let actual = r.actual();
        let own_id = tenant
            .own_ids
            .then(|| format!("{}-{}", SERVICES[r.service].0, r.row));
        let seen = &mut stats.tenants[r.tenant()];
        seen.requests += 1;

        let Some(id) = reserve(&mut con, key, amount, own_id.as_deref())? else {
            stats.commands += 1;
            seen.denied += 1;
            continue;
        };
        stats.commands += 1;
        if let Some(own) = &own_id {
            // A retry after a lost reply: same id back, nothing reserved twice.
            let again = reserve(&mut con, key, amount, Some(own))?;
            stats.commands += 1;
            if again.as_deref() != Some(own.as_bytes()) {
                return Err(format!(
                    "retried QUOTA.RESERVE {key} {amount} ID {own} answered {again:?}, \
                     expected the same id"
                )
                .into());
            }
            stats.reserve_retries += 1;
        }

        let (status, charged) = settle(&mut con, key, &id, actual)?;
        stats.commands += 1;
        if status != "settled" || charged != actual {
            return Err(format!(
                "QUOTA.SETTLE {key} {} {actual} answered [{status}, {charged}], \
                 expected [settled, {actual}]",
                String::from_utf8_lossy(&id)
            )
            .into());
        }
        seen.granted += 1;
        seen.settled_tokens += actual;
        if own_id.is_some() {
            // The same SETTLE again: must be recognised, not charged twice.
            let (status, charged) = settle(&mut con, key, &id, actual)?;
            stats.commands += 1;
            if status != "duplicate" || charged != actual {
                return Err(format!(
                    "retried QUOTA.SETTLE {key} {} {actual} answered [{status}, {charged}], \
                     expected [duplicate, {actual}]",
                    String::from_utf8_lossy(&id)
                )
                .into());
            }
            stats.settle_duplicates += 1;
        }
    }
}

/// QUOTA.RESERVE: `Some(id)` if granted, `None` if denied.
fn reserve(
    con: &mut redis::Connection,
    key: &str,
    amount: u64,
    id: Option<&str>,
) -> Result<Option<Vec<u8>>> {
    let mut cmd = redis::cmd("QUOTA.RESERVE");
    cmd.arg(key).arg(amount);
    if let Some(id) = id {
        cmd.arg("ID").arg(id);
    }
    let (granted, id, _available, _retry_after): (i64, Option<Vec<u8>>, i64, i64) = cmd
        .query(con)
        .map_err(|e| format!("QUOTA.RESERVE {key} {amount}: {e}"))?;
    match (granted, id) {
        (1, Some(id)) => Ok(Some(id)),
        (0, None) => Ok(None),
        (g, id) => {
            Err(format!("QUOTA.RESERVE {key} {amount}: unexpected reply [{g}, {id:?}, ..]").into())
        }
    }
}

/// QUOTA.SETTLE: (status, charged).
fn settle(con: &mut redis::Connection, key: &str, id: &[u8], actual: u64) -> Result<(String, u64)> {
    let (status, charged, _available): (String, u64, i64) = redis::cmd("QUOTA.SETTLE")
        .arg(key)
        .arg(id)
        .arg(actual)
        .query(con)
        .map_err(|e| {
            format!(
                "QUOTA.SETTLE {key} {} {actual}: {e}",
                String::from_utf8_lossy(id)
            )
        })?;
    Ok((status, charged))
}

fn print_table(tenants: &[Tenant], stats: &Stats) {
    println!(
        "{:<8} {:<28} {:>12} {:>12} {:>9} {:>8} {:>7} {:>12}",
        "tenant", "provisioned", "demand", "limit", "requests", "granted", "denied", "tokens used"
    );
    let mut total = TenantStats::default();
    for (t, s) in tenants.iter().zip(&stats.tenants) {
        let provisioned = match t.provision {
            Provision::Full => "full (+8 in flight)".to_string(),
            Provision::Percent(p) => format!("{p}% of demand"),
        };
        let ids = if t.own_ids { ", own ids" } else { "" };
        println!(
            "{:<8} {:<28} {:>12} {:>12} {:>9} {:>8} {:>7} {:>12}",
            t.name,
            format!("{provisioned}{ids}"),
            thousands(t.demand),
            thousands(t.limit),
            thousands(s.requests),
            thousands(s.granted),
            thousands(s.denied),
            thousands(s.settled_tokens),
        );
        total.requests += s.requests;
        total.granted += s.granted;
        total.denied += s.denied;
        total.settled_tokens += s.settled_tokens;
    }
    println!(
        "{:<8} {:<28} {:>12} {:>12} {:>9} {:>8} {:>7} {:>12}",
        "total",
        "",
        thousands(tenants.iter().map(|t| t.demand).sum()),
        thousands(tenants.iter().map(|t| t.limit).sum()),
        thousands(total.requests),
        thousands(total.granted),
        thousands(total.denied),
        thousands(total.settled_tokens),
    );
}

/// Compares QUOTA.INFO with the client's view; prints one line per tenant and one overall.
fn reconcile(con: &mut redis::Connection, tenants: &[Tenant], stats: &Stats) -> Result<bool> {
    let mut all_ok = true;
    let (mut redis_used, mut client_used, mut reserved_sum, mut pending_sum) = (0i64, 0u64, 0, 0);
    for (t, s) in tenants.iter().zip(&stats.tenants) {
        // Every field is read as a generic value: QUOTA.INFO also has text fields (and may
        // gain more); only the integer fields below are used.
        let info: Option<HashMap<String, redis::Value>> = redis::cmd("QUOTA.INFO")
            .arg(&t.key)
            .query(con)
            .map_err(|e| format!("QUOTA.INFO {}: {e}", t.key))?;
        let info = info.ok_or_else(|| format!("QUOTA.INFO {}: the budget is gone", t.key))?;
        let field = |name: &str| match info.get(name) {
            Some(redis::Value::Int(n)) => Ok(*n),
            Some(other) => Err(format!(
                "QUOTA.INFO {}: field {name} is not an integer: {other:?}",
                t.key
            )),
            None => Err(format!("QUOTA.INFO {}: no {name} field", t.key)),
        };
        let (used, reserved, pending, limit) = (
            field("used")?,
            field("reserved")?,
            field("pending")?,
            field("limit")?,
        );
        let mut problems = Vec::new();
        if u64::try_from(used).ok() != Some(s.settled_tokens) {
            problems.push("used != client settled");
        }
        if reserved != 0 {
            problems.push("reserved != 0");
        }
        if pending != 0 {
            problems.push("pending != 0");
        }
        if used > limit {
            problems.push("used > limit");
        }
        if matches!(t.provision, Provision::Full) && s.denied != 0 {
            problems.push("a fully provisioned tenant was denied");
        }
        let verdict = if problems.is_empty() {
            "OK".to_string()
        } else {
            all_ok = false;
            format!("MISMATCH: {}", problems.join(", "))
        };
        let same = if u64::try_from(used).ok() == Some(s.settled_tokens) {
            "=="
        } else {
            "!="
        };
        println!(
            "reconcile {:<7} used in Redis {:>11} {same} settled by clients {:>11}; \
             reserved {reserved}, pending {pending}  {verdict}",
            t.name,
            thousands_i(used),
            thousands(s.settled_tokens),
        );
        redis_used += used;
        client_used += s.settled_tokens;
        reserved_sum += reserved;
        pending_sum += pending;
    }
    let overall_ok = all_ok
        && u64::try_from(redis_used).ok() == Some(client_used)
        && reserved_sum == 0
        && pending_sum == 0;
    let same = if u64::try_from(redis_used).ok() == Some(client_used) {
        "=="
    } else {
        "!="
    };
    println!(
        "reconcile {:<7} used in Redis {:>11} {same} settled by clients {:>11}; \
         reserved {reserved_sum}, pending {pending_sum}  {}",
        "ALL",
        thousands_i(redis_used),
        thousands(client_used),
        if overall_ok { "OK" } else { "MISMATCH" },
    );
    Ok(overall_ok)
}

/// 1234567 → "1,234,567".
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn thousands_i(n: i64) -> String {
    let sign = if n < 0 { "-" } else { "" };
    format!("{sign}{}", thousands(n.unsigned_abs()))
}

/// The server binary: `$REDIS_SERVER` (e.g. `valkey-server`), else `redis-server`.
fn server_bin() -> String {
    std::env::var("REDIS_SERVER")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".into())
}

/// `$QUOTA_MODULE`, else the release build, as an absolute path (redis-server changes directory
/// to `--dir` before loading modules).
fn module_path() -> Result<PathBuf> {
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
struct Server {
    port: u16,
    module: PathBuf,
    dir: PathBuf,
    child: Child,
}

impl Server {
    fn start(module: &Path) -> Result<Server> {
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
