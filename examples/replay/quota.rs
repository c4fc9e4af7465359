//! The replay's quota calls: one tenant's four limits (concurrency, RPM, TPM, budget), admitted
//! and settled together.
//!
//! With the multi-key commands (`QUOTA.MRESERVE` / `QUOTA.MSETTLE`, [`Mode::Multi`]) a request
//! is one atomic call in and one out. Servers without them get [`Mode::Single`]: the same limits
//! with one call per key (`QUOTA.RESERVE` per budget, `QUOTA.WINDOW` per window, `QUOTA.ROLLBACK`
//! of what was taken when a later limit denies). That is not atomic: a request denied by TPM
//! has already counted against RPM, which is the gap the multi-key commands close.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use redis::aio::MultiplexedConnection;
use redis::Value;

use super::Result;

/// QUOTA.* commands sent so far (every admission, settle, retry and rollback).
static COMMANDS: AtomicU64 = AtomicU64::new(0);

/// How many QUOTA.* commands this process has sent.
pub fn commands() -> u64 {
    COMMANDS.load(Ordering::Relaxed)
}

/// The limits of one request, in the order they are checked (MRESERVE's key order, so its
/// `denied_index` is an index into this).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Limit {
    /// Requests in flight: a budget reserved with amount 1 and settled with actual 0.
    Concurrency,
    /// Requests per minute: a window key, cost 1.
    Rpm,
    /// Tokens per minute: a window key, cost = the reservation, corrected to the real tokens.
    Tpm,
    /// The tenant's token budget for the run.
    Budget,
}

impl Limit {
    pub const ALL: [Limit; 4] = [Limit::Concurrency, Limit::Rpm, Limit::Tpm, Limit::Budget];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            Limit::Concurrency => "concurrency",
            Limit::Rpm => "RPM",
            Limit::Tpm => "TPM",
            Limit::Budget => "budget",
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which commands the server offers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// QUOTA.MRESERVE / QUOTA.MSETTLE and window keys configured by QUOTA.SET ... WINDOW.
    Multi,
    /// One call per key (servers without the multi-key commands).
    Single,
}

/// One tenant's keys, all under the hash tag `{tenant}` (one slot in a cluster).
#[derive(Clone, Debug)]
pub struct Keys {
    pub concurrency: String,
    pub rpm: String,
    pub tpm: String,
    pub budget: String,
    /// The budget's usage stream (`QUOTA.SET ... STREAM`), same hash tag: same slot.
    pub usage: String,
}

impl Keys {
    pub fn new(prefix: &str, tenant: &str) -> Keys {
        let key = |what: &str| format!("{prefix}{{{tenant}}}:{what}");
        Keys {
            concurrency: key("concurrency"),
            rpm: key("rpm"),
            tpm: key("tpm"),
            budget: key("budget"),
            usage: key("usage"),
        }
    }

    /// In [`Limit::ALL`] order.
    pub fn all(&self) -> [&str; 4] {
        [&self.concurrency, &self.rpm, &self.tpm, &self.budget]
    }
}

/// One tenant's limits: requests in flight, requests and tokens per window, tokens in total.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub concurrency: u64,
    pub rpm: u64,
    pub tpm: u64,
    pub budget: u64,
}

/// A tenant as the server sees it.
#[derive(Clone, Debug)]
pub struct Quota {
    pub keys: Keys,
    pub limits: Limits,
    /// The window of RPM and TPM in real ms: one trace minute at the replay's speed.
    pub window_ms: u64,
    /// Reservation TTL (ms) of both budgets.
    pub ttl_ms: u64,
}

/// Answer to an admission.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// Every limit took the request; the reservation id (the same on every budget key).
    Granted(Vec<u8>),
    /// The first limit that denied; nothing was taken (multi-key mode).
    Denied(Limit),
}

/// What the budget key answered to a settle (`settled`, `late` or `duplicate`, and charged),
/// after the concurrency key was checked to have settled its 0.
#[derive(Debug)]
pub struct Settled {
    pub status: String,
    pub charged: u64,
}

/// `Mode::Multi` if the server has QUOTA.MRESERVE, else `Mode::Single`.
pub async fn detect(con: &mut MultiplexedConnection) -> Result<Mode> {
    let info: Vec<Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("quota.mreserve")
        .query_async(con)
        .await
        .map_err(|e| format!("COMMAND INFO quota.mreserve: {e}"))?;
    Ok(match info.first() {
        Some(Value::Array(_)) => Mode::Multi,
        _ => Mode::Single,
    })
}

/// Fresh keys for a tenant: DEL, then QUOTA.SET the budgets (and, in multi-key mode, the
/// windows' limit and window) — each must be created. With `usage`, the token budget logs
/// every charge to its usage stream `keys.usage` (deleted first, with its consumer groups).
pub async fn provision(
    con: &mut MultiplexedConnection,
    mode: Mode,
    q: &Quota,
    usage: bool,
) -> Result<()> {
    let _: i64 = redis::cmd("DEL")
        .arg(&q.keys.all()[..])
        .arg(&q.keys.usage)
        .query_async(con)
        .await
        .map_err(|e| format!("DEL {:?} {}: {e}", q.keys.all(), q.keys.usage))?;
    let mut budget = budget_set(&q.keys.budget, q.limits.budget, q.ttl_ms);
    if usage {
        budget.0.arg("STREAM").arg(&q.keys.usage);
        budget.1.push_str(&format!(" STREAM {}", q.keys.usage));
    }
    let mut sets = vec![
        budget_set(&q.keys.concurrency, q.limits.concurrency, q.ttl_ms),
        budget,
    ];
    if mode == Mode::Multi {
        sets.push(window_set(&q.keys.rpm, q.limits.rpm, q.window_ms));
        sets.push(window_set(&q.keys.tpm, q.limits.tpm, q.window_ms));
    }
    for (cmd, text) in sets {
        let created: i64 = cmd.query_async(con).await.map_err(|e| {
            format!("{text} failed: {e} (is the redis-quota module loaded on this server?)")
        })?;
        if created != 1 {
            return Err(format!("{text} answered {created}, expected 1 (created)").into());
        }
    }
    Ok(())
}

fn budget_set(key: &str, limit: u64, ttl_ms: u64) -> (redis::Cmd, String) {
    let mut cmd = redis::cmd("QUOTA.SET");
    cmd.arg(key).arg("LIMIT").arg(limit).arg("TTL").arg(ttl_ms);
    (cmd, format!("QUOTA.SET {key} LIMIT {limit} TTL {ttl_ms}"))
}

fn window_set(key: &str, limit: u64, window_ms: u64) -> (redis::Cmd, String) {
    let mut cmd = redis::cmd("QUOTA.SET");
    cmd.arg(key).arg("WINDOW").arg(limit).arg(window_ms);
    (cmd, format!("QUOTA.SET {key} WINDOW {limit} {window_ms}"))
}

/// Admits one request of `amount` tokens (its reservation) against all four limits, with the
/// client's own `id` if given.
pub async fn admit(
    con: &mut MultiplexedConnection,
    mode: Mode,
    q: &Quota,
    amount: u64,
    id: Option<&str>,
) -> Result<Admission> {
    match mode {
        Mode::Multi => mreserve(con, q, amount, id).await,
        Mode::Single => admit_single(con, q, amount, id).await,
    }
}

/// The same admission again with the same `id`, as a client retrying after a lost reply: must
/// answer the same id and take nothing more. (Single-key mode retries the two budgets only: a
/// window call is not idempotent.)
pub async fn admit_again(
    con: &mut MultiplexedConnection,
    mode: Mode,
    q: &Quota,
    amount: u64,
    id: &str,
) -> Result<Admission> {
    match mode {
        Mode::Multi => mreserve(con, q, amount, Some(id)).await,
        Mode::Single => {
            let first = reserve(con, &q.keys.concurrency, 1, Some(id)).await?;
            let second = reserve(con, &q.keys.budget, amount, Some(id)).await?;
            match (first, second) {
                (Some(a), Some(b)) if a == b => Ok(Admission::Granted(a)),
                (a, b) => Err(format!(
                    "retried QUOTA.RESERVE ID {id}: concurrency answered {a:?}, budget {b:?}"
                )
                .into()),
            }
        }
    }
}

/// Settles a granted request: the concurrency slot with 0, RPM with 1, TPM and the budget with
/// the real tokens.
pub async fn settle(
    con: &mut MultiplexedConnection,
    mode: Mode,
    q: &Quota,
    id: &[u8],
    actual: u64,
) -> Result<Settled> {
    match mode {
        Mode::Multi => msettle(con, q, id, actual).await,
        Mode::Single => {
            let (slot, _) = settle_one(con, &q.keys.concurrency, id, 0).await?;
            let (status, charged) = settle_one(con, &q.keys.budget, id, actual).await?;
            check_slot(&q.keys.concurrency, &slot, &status)?;
            Ok(Settled { status, charged })
        }
    }
}

/// The concurrency slot settles exactly as the budget does (both are budgets under one id).
fn check_slot(key: &str, slot: &str, budget: &str) -> Result<()> {
    if slot == budget {
        Ok(())
    } else {
        Err(format!("{key} answered {slot:?} to the settle, the budget {budget:?}").into())
    }
}

async fn mreserve(
    con: &mut MultiplexedConnection,
    q: &Quota,
    amount: u64,
    id: Option<&str>,
) -> Result<Admission> {
    COMMANDS.fetch_add(1, Ordering::Relaxed);
    let keys = q.keys.all();
    let mut cmd = redis::cmd("QUOTA.MRESERVE");
    cmd.arg(keys.len())
        .arg(&keys[..])
        .arg(1)
        .arg(1)
        .arg(amount)
        .arg(amount);
    if let Some(id) = id {
        cmd.arg("ID").arg(id);
    }
    let text = || format!("QUOTA.MRESERVE 4 {} 1 1 {amount} {amount}", keys.join(" "));
    let (granted, id, denied, _retry_after, _values): (i64, Option<Vec<u8>>, i64, i64, Vec<i64>) =
        cmd.query_async(con)
            .await
            .map_err(|e| format!("{}: {e}", text()))?;
    match (granted, id, usize::try_from(denied).ok()) {
        (1, Some(id), None) => Ok(Admission::Granted(id)),
        (0, None, Some(i)) if i < Limit::ALL.len() => Ok(Admission::Denied(Limit::ALL[i])),
        (g, id, _) => {
            Err(format!("{}: unexpected reply [{g}, {id:?}, {denied}, ..]", text()).into())
        }
    }
}

async fn msettle(
    con: &mut MultiplexedConnection,
    q: &Quota,
    id: &[u8],
    actual: u64,
) -> Result<Settled> {
    COMMANDS.fetch_add(1, Ordering::Relaxed);
    let keys = q.keys.all();
    let text = || {
        format!(
            "QUOTA.MSETTLE 4 {} {} 0 1 {actual} {actual}",
            keys.join(" "),
            String::from_utf8_lossy(id)
        )
    };
    let reply: Vec<(String, i64, i64)> = redis::cmd("QUOTA.MSETTLE")
        .arg(keys.len())
        .arg(&keys[..])
        .arg(id)
        .arg(0)
        .arg(1)
        .arg(actual)
        .arg(actual)
        .query_async(con)
        .await
        .map_err(|e| format!("{}: {e}", text()))?;
    let [(slot, _, _), _rpm, _tpm, (status, charged, _)] = &reply[..] else {
        return Err(format!("{}: expected 4 entries, got {reply:?}", text()).into());
    };
    check_slot(&q.keys.concurrency, slot, status)?;
    let charged =
        u64::try_from(*charged).map_err(|_| format!("{}: charged {charged} < 0", text()))?;
    Ok(Settled {
        status: status.clone(),
        charged,
    })
}

/// Single-key mode: concurrency, RPM, TPM, budget in turn; what was taken is given back when a
/// later limit denies (except RPM's count, which a window cannot give back).
async fn admit_single(
    con: &mut MultiplexedConnection,
    q: &Quota,
    amount: u64,
    id: Option<&str>,
) -> Result<Admission> {
    let Some(id) = reserve(con, &q.keys.concurrency, 1, id).await? else {
        return Ok(Admission::Denied(Limit::Concurrency));
    };
    let denied = if !window(con, &q.keys.rpm, q.limits.rpm, q.window_ms, 1).await? {
        Some(Limit::Rpm)
    } else if !window(con, &q.keys.tpm, q.limits.tpm, q.window_ms, amount).await? {
        Some(Limit::Tpm)
    } else {
        let id_text = String::from_utf8_lossy(&id).into_owned();
        match reserve(con, &q.keys.budget, amount, Some(&id_text)).await? {
            Some(_) => None,
            None => Some(Limit::Budget),
        }
    };
    match denied {
        None => Ok(Admission::Granted(id)),
        Some(limit) => {
            COMMANDS.fetch_add(1, Ordering::Relaxed);
            let _: Value = redis::cmd("QUOTA.ROLLBACK")
                .arg(&q.keys.concurrency)
                .arg(&id)
                .query_async(con)
                .await
                .map_err(|e| format!("QUOTA.ROLLBACK {}: {e}", q.keys.concurrency))?;
            Ok(Admission::Denied(limit))
        }
    }
}

/// QUOTA.RESERVE: `Some(id)` if granted, `None` if denied.
async fn reserve(
    con: &mut MultiplexedConnection,
    key: &str,
    amount: u64,
    id: Option<&str>,
) -> Result<Option<Vec<u8>>> {
    COMMANDS.fetch_add(1, Ordering::Relaxed);
    let mut cmd = redis::cmd("QUOTA.RESERVE");
    cmd.arg(key).arg(amount);
    if let Some(id) = id {
        cmd.arg("ID").arg(id);
    }
    let (granted, id, _available, _retry_after): (i64, Option<Vec<u8>>, i64, i64) = cmd
        .query_async(con)
        .await
        .map_err(|e| format!("QUOTA.RESERVE {key} {amount}: {e}"))?;
    match (granted, id) {
        (1, Some(id)) => Ok(Some(id)),
        (0, None) => Ok(None),
        (g, id) => {
            Err(format!("QUOTA.RESERVE {key} {amount}: unexpected reply [{g}, {id:?}, ..]").into())
        }
    }
}

/// QUOTA.WINDOW with the limit and window on the call: allowed or not.
async fn window(
    con: &mut MultiplexedConnection,
    key: &str,
    limit: u64,
    window_ms: u64,
    cost: u64,
) -> Result<bool> {
    COMMANDS.fetch_add(1, Ordering::Relaxed);
    let (allowed, _remaining, _retry, _reset): (i64, i64, i64, i64) = redis::cmd("QUOTA.WINDOW")
        .arg(key)
        .arg(limit)
        .arg(window_ms)
        .arg("COST")
        .arg(cost)
        .query_async(con)
        .await
        .map_err(|e| format!("QUOTA.WINDOW {key} {limit} {window_ms} COST {cost}: {e}"))?;
    Ok(allowed == 1)
}

/// QUOTA.SETTLE: (status, charged).
async fn settle_one(
    con: &mut MultiplexedConnection,
    key: &str,
    id: &[u8],
    actual: u64,
) -> Result<(String, u64)> {
    COMMANDS.fetch_add(1, Ordering::Relaxed);
    let (status, charged, _available): (String, u64, i64) = redis::cmd("QUOTA.SETTLE")
        .arg(key)
        .arg(id)
        .arg(actual)
        .query_async(con)
        .await
        .map_err(|e| {
            format!(
                "QUOTA.SETTLE {key} {} {actual}: {e}",
                String::from_utf8_lossy(id)
            )
        })?;
    Ok((status, charged))
}
