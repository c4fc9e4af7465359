//! Helpers shared by the reliability tests (fuzz_live, corrupt_restore, crash_durability,
//! failover): a seeded PRNG, the ledger invariants as a client sees them, and process control.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use redis::Value;

/// A small deterministic PRNG (xorshift64) so a failure replays from its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // Never 0 (a fixed point of xorshift); mix the seed a little.
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform index into a slice of length `n` (`n > 0`).
    pub fn index(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True with probability `1/n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.index(items.len())]
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// The seed of a randomized test: `$name` if set (to replay a failure), else `default`.
pub fn seed(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A flat field/value reply (RESP2 array or RESP3 map) as a map of its integer fields.
pub fn int_fields(v: &Value) -> BTreeMap<String, i64> {
    let pairs: Vec<(Value, Value)> = match v {
        Value::Array(a) => a.chunks(2).map(|c| (c[0].clone(), c[1].clone())).collect(),
        Value::Map(m) => m.clone(),
        other => panic!("expected a field/value reply, got {other:?}"),
    };
    pairs
        .into_iter()
        .filter_map(|(k, v)| match (k, v) {
            (Value::BulkString(k), Value::Int(n)) => Some((String::from_utf8_lossy(&k).into(), n)),
            (Value::SimpleString(k), Value::Int(n)) => Some((k, n)),
            _ => None,
        })
        .collect()
}

/// One budget as a client sees it at one instant: QUOTA.INFO's numbers and the live pending
/// reservations `(id, amount)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub info: BTreeMap<String, i64>,
    pub pending: Vec<(Vec<u8>, i64)>,
}

/// Reads a budget consistently and checks the invariants a client can see, with AT-free calls:
/// `available == limit - used - reserved`, `reserved == sum of PENDING amounts`,
/// `pending == number of PENDING entries` (the key must hold fewer than 10 000).
///
/// INFO, PENDING COUNT 10000 and INFO again run in one MULTI. Time passes between them (the
/// module reads the wall clock per command), so a reservation may expire in between; its
/// `reserved` only ever falls with time, so when both INFOs agree nothing expired in between and
/// the PENDING listing is of the same state. Otherwise it reads again.
///
/// `Ok(None)` if the key holds no budget; `Err` names a broken invariant.
pub fn budget_snapshot(c: &mut redis::Connection, key: &[u8]) -> Result<Option<Snapshot>, String> {
    for _ in 0..20 {
        let replies: Vec<Value> = redis::pipe()
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
            .map_err(|e| format!("MULTI INFO/PENDING/INFO failed: {e}"))?;
        if replies[0] == Value::Nil {
            return Ok(None);
        }
        let first = int_fields(&replies[0]);
        if first != int_fields(&replies[2]) {
            continue;
        }
        let Value::Array(entries) = &replies[1] else {
            return Err(format!("PENDING is not an array: {:?}", replies[1]));
        };
        let mut pending = Vec::new();
        for e in entries {
            match e {
                Value::Array(f) if f.len() == 6 => match (&f[0], &f[1], &f[2], &f[3], &f[4], &f[5])
                {
                    (
                        Value::BulkString(id),
                        Value::Int(amount),
                        Value::Int(age),
                        Value::Int(ttl),
                        Value::Int(start),
                        Value::Int(heartbeat),
                    ) => {
                        // The last heartbeat, if any, is not before the start.
                        if *age < 0
                            || *ttl <= 0
                            || *amount < 0
                            || (*heartbeat != -1 && *heartbeat < *start)
                        {
                            return Err(format!("bad PENDING entry {f:?}"));
                        }
                        pending.push((id.clone(), *amount));
                    }
                    _ => return Err(format!("bad PENDING entry {f:?}")),
                },
                other => return Err(format!("bad PENDING entry {other:?}")),
            }
        }
        let snap = Snapshot {
            info: first,
            pending,
        };
        snap.check()?;
        return Ok(Some(snap));
    }
    Err("the budget kept changing between two reads of one MULTI".into())
}

impl Snapshot {
    pub fn get(&self, field: &str) -> i64 {
        self.info[field]
    }

    /// The invariants between INFO and PENDING.
    pub fn check(&self) -> Result<(), String> {
        let f = |name: &str| {
            self.info
                .get(name)
                .copied()
                .ok_or_else(|| format!("INFO has no {name}: {:?}", self.info))
        };
        let (limit, used, reserved, available) =
            (f("limit")?, f("used")?, f("reserved")?, f("available")?);
        let (overdraft, count) = (f("overdraft")?, f("pending")?);
        if used < 0 || reserved < 0 || limit < 0 || overdraft < 0 {
            return Err(format!("negative counter: {:?}", self.info));
        }
        let want = (i128::from(limit) - i128::from(used) - i128::from(reserved))
            .clamp(i128::from(i64::MIN), i128::from(i64::MAX));
        if i128::from(available) != want {
            return Err(format!(
                "available != limit - used - reserved: {:?}",
                self.info
            ));
        }
        if count >= 10_000 {
            return Err(format!("too many pending to list: {count}"));
        }
        let sum: i128 = self.pending.iter().map(|(_, a)| i128::from(*a)).sum();
        if sum != i128::from(reserved) {
            return Err(format!(
                "reserved {reserved} != sum of PENDING amounts {sum} ({} entries)",
                self.pending.len()
            ));
        }
        if usize::try_from(count).ok() != Some(self.pending.len()) {
            return Err(format!(
                "INFO pending {count} != {} PENDING entries",
                self.pending.len()
            ));
        }
        Ok(())
    }
}

/// `INFO <section>` as text.
pub fn info_section(c: &mut redis::Connection, section: &str) -> String {
    redis::cmd("INFO").arg(section).query(c).unwrap()
}

/// One numeric field of `INFO <section>`.
pub fn info_field(c: &mut redis::Connection, section: &str, field: &str) -> i64 {
    let text = info_section(c, section);
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in INFO {section}:\n{text}"))
}

/// The server's pid (`INFO server`), to stop and continue it.
pub fn pid(c: &mut redis::Connection) -> i32 {
    i32::try_from(info_field(c, "server", "process_id")).unwrap()
}

/// Sends `signal` to `pid`.
pub fn signal(pid: i32, signal: i32) {
    // SAFETY: kill(2) on a pid of a redis-server this test started.
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(rc, 0, "kill({pid}, {signal})");
}

/// Waits until a replica's link to its master is up.
pub fn wait_link_up(replica: &mut redis::Connection) {
    for _ in 0..400 {
        if info_section(replica, "replication").contains("master_link_status:up") {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!(
        "replica link never came up:\n{}",
        info_section(replica, "replication")
    );
}
