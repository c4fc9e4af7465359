//! Memory per item (module vs the Lua baseline) and the sweeper's lag with many pending
//! reservations. Each measurement runs on a fresh server so nothing else is in `used_memory`.

use std::path::Path;
use std::time::{Duration, Instant};

use redis::{Connection, Value};

use crate::load::{
    has_command, MultiKeys, MRESERVE_LUA, MSETTLE_LUA, MULTI_ACTUALS, MULTI_AMOUNTS, MULTI_BUDGETS,
    MULTI_KEYS, RESERVE_LUA, SETTLE_LUA, WINDOW_LUA,
};
use crate::server::{info, info_i64, used_memory, Server};
use crate::Result;

/// Keys the pending / finished items are spread over.
const MEM_KEYS: usize = 100;
const PIPELINE: usize = 512;

/// Bytes per item, by `used_memory` delta and by `MEMORY USAGE`.
#[derive(Clone, Copy, Debug, Default)]
pub struct PerItem {
    pub used_memory: f64,
    pub memory_usage: f64,
}

#[derive(Clone, Debug, Default)]
pub struct MemoryResults {
    pub items: usize,
    pub module_pending: PerItem,
    pub module_finished: PerItem,
    pub lua_pending: PerItem,
    pub lua_finished: PerItem,
    pub window_keys: usize,
    pub window_rate: usize,
    pub module_window: PerItem,
    pub lua_window: PerItem,
    /// Members held per Lua window key at the end.
    pub lua_window_members: usize,
    /// 5-key reservations (3 budgets + RPM + TPM windows of an hour, one tenant's keys)
    /// measured, over [`MEM_KEYS`] tenants.
    pub multi_items: usize,
    /// Per 5-key reservation, pending and then settled; `None`: the module has no MRESERVE.
    pub module_multi: Option<(PerItem, PerItem)>,
    pub lua_multi: (PerItem, PerItem),
    /// Of the module's pending 5-key reservation, `MEMORY USAGE` bytes per request in one
    /// budget key and in one window key.
    pub module_multi_split: Option<(f64, f64)>,
}

/// The multi-limit memory measurement's window: an hour (default precision, 1 min), so that
/// every reservation made during the measurement is still inside it.
const MULTI_WINDOW_MS: i64 = 3_600_000;

/// A 16-byte id (the goal's bound) unique per item.
fn id16(i: usize) -> String {
    format!("id-{i:013}")
}

fn memory_usage(con: &mut Connection, key: &str) -> Result<i64> {
    let v: Option<i64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query(con)?;
    v.ok_or_else(|| format!("MEMORY USAGE {key}: no such key").into())
}

/// Average `MEMORY USAGE` over `keys`.
fn avg_usage(con: &mut Connection, keys: &[String]) -> Result<f64> {
    let mut sum = 0i64;
    for k in keys {
        sum += memory_usage(con, k)?;
    }
    Ok(sum as f64 / keys.len().max(1) as f64)
}

/// Sends `cmds` in pipelines of `PIPELINE`, checking each reply with `check`.
fn send_all(
    con: &mut Connection,
    total: usize,
    mut build: impl FnMut(&mut redis::Pipeline, usize),
    check: impl Fn(&Value) -> bool,
) -> Result<()> {
    let mut i = 0;
    while i < total {
        let mut p = redis::pipe();
        let end = (i + PIPELINE).min(total);
        for j in i..end {
            build(&mut p, j);
        }
        let replies: Vec<Value> = p.query(con)?;
        if let Some(bad) = replies.iter().find(|v| !check(v)) {
            return Err(format!("unexpected reply {bad:?}").into());
        }
        i = end;
    }
    Ok(())
}

fn is_int(v: &Value, want: i64) -> bool {
    matches!(v, Value::Int(n) if *n == want)
}

fn first_is(v: &Value, want: i64) -> bool {
    matches!(v, Value::Array(a) if matches!(a.first(), Some(Value::Int(n)) if *n == want))
}

fn status_is(v: &Value, want: &str) -> bool {
    matches!(v, Value::Array(a) if matches!(a.first(), Some(Value::SimpleString(s)) if s == want))
}

/// `used_memory` read on a fresh connection after the loading one was closed: a pipelining
/// client's query and reply buffers would otherwise count as data (tens of KiB).
fn settled_memory(server: &Server, con: &mut Connection) -> Result<i64> {
    *con = server.connection()?;
    std::thread::sleep(Duration::from_millis(100));
    used_memory(con)
}

pub fn measure_memory(
    module: &Path,
    items: usize,
    window_keys: usize,
    window_rate: usize,
) -> Result<MemoryResults> {
    let mut r = MemoryResults {
        items,
        window_keys,
        window_rate,
        ..Default::default()
    };
    let per_key = (items / MEM_KEYS) as f64;

    // Module: pending reservations, then the same ids settled (remembered finished ids).
    {
        let server = Server::start(module, "mem-module", &[])?;
        let mut con = server.connection()?;
        let keys: Vec<String> = (0..MEM_KEYS).map(|k| format!("mq:{k}")).collect();
        for k in &keys {
            redis::cmd("QUOTA.SET")
                .arg(k)
                .arg("LIMIT")
                .arg(1_000_000_000_000i64)
                .arg("TTL")
                .arg(3_600_000)
                .query::<i64>(&mut con)?;
        }
        let m0 = settled_memory(&server, &mut con)?;
        let u0 = avg_usage(&mut con, &keys)?;
        send_all(
            &mut con,
            items,
            |p, i| {
                p.cmd("QUOTA.RESERVE")
                    .arg(&keys[i % MEM_KEYS])
                    .arg(1)
                    .arg("ID")
                    .arg(id16(i));
            },
            |v| first_is(v, 1),
        )?;
        let m1 = settled_memory(&server, &mut con)?;
        let u1 = avg_usage(&mut con, &keys)?;
        r.module_pending = PerItem {
            used_memory: (m1 - m0) as f64 / items as f64,
            memory_usage: (u1 - u0) / per_key,
        };
        send_all(
            &mut con,
            items,
            |p, i| {
                p.cmd("QUOTA.SETTLE")
                    .arg(&keys[i % MEM_KEYS])
                    .arg(id16(i))
                    .arg(1);
            },
            |v| status_is(v, "settled"),
        )?;
        let m2 = settled_memory(&server, &mut con)?;
        let u2 = avg_usage(&mut con, &keys)?;
        r.module_finished = PerItem {
            used_memory: (m2 - m0) as f64 / items as f64,
            memory_usage: (u2 - u0) / per_key,
        };
    }

    // Lua: a detail hash per reservation (with its TTL), settled in place.
    {
        let server = Server::start(module, "mem-lua", &[])?;
        let mut con = server.connection()?;
        let reserve: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(RESERVE_LUA)
            .query(&mut con)?;
        let settle: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(SETTLE_LUA)
            .query(&mut con)?;
        let tenants: Vec<String> = (0..MEM_KEYS).map(|k| format!("lt:{k}")).collect();
        for t in &tenants {
            redis::cmd("HSET")
                .arg(t)
                .arg("total")
                .arg(1_000_000_000_000i64)
                .arg("used")
                .arg(0)
                .arg("reserved")
                .arg(0)
                .query::<i64>(&mut con)?;
        }
        let m0 = settled_memory(&server, &mut con)?;
        let detail = |i: usize| format!("quota_reserve:{}", id16(i));
        send_all(
            &mut con,
            items,
            |p, i| {
                p.cmd("EVALSHA")
                    .arg(&reserve)
                    .arg(2)
                    .arg(&tenants[i % MEM_KEYS])
                    .arg(detail(i))
                    .arg(1);
            },
            |v| is_int(v, 1),
        )?;
        let sample: Vec<String> = (0..items)
            .step_by((items / 1000).max(1))
            .map(detail)
            .collect();
        let m1 = settled_memory(&server, &mut con)?;
        r.lua_pending = PerItem {
            used_memory: (m1 - m0) as f64 / items as f64,
            memory_usage: avg_usage(&mut con, &sample)?,
        };
        send_all(
            &mut con,
            items,
            |p, i| {
                p.cmd("EVALSHA")
                    .arg(&settle)
                    .arg(2)
                    .arg(&tenants[i % MEM_KEYS])
                    .arg(detail(i))
                    .arg(1);
            },
            |v| is_int(v, 1),
        )?;
        let m2 = settled_memory(&server, &mut con)?;
        r.lua_finished = PerItem {
            used_memory: (m2 - m0) as f64 / items as f64,
            memory_usage: avg_usage(&mut con, &sample)?,
        };
    }

    measure_multi(module, items / MULTI_KEYS, &mut r)?;

    // Windows of 60 s at 1 s precision, `window_rate` calls per second per key for 62 s of
    // (simulated) time: every bucket of the window is in use.
    {
        let server = Server::start(module, "mem-window", &["test-clock", "yes"])?;
        let mut con = server.connection()?;
        let window: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(WINDOW_LUA)
            .query(&mut con)?;
        // Times start at the wall clock so that no key's expiry is already past.
        let t0 = now_ms();
        let calls_per_key = 62 * window_rate;
        // Call i of a run over n keys: key i % n at step i / n.
        let at = |i: usize, n: usize| -> i64 {
            let step = i / n;
            t0 + (step * 1000 / window_rate) as i64
        };
        // Each side first loads a few warm-up keys the same way, outside the measurement:
        // what the first keys cost once (client buffers, dict tables' first growth) would
        // otherwise be spread over the measured ones.
        let warm = (window_keys / 10).max(20);
        let module_calls = |con: &mut Connection, prefix: &str, n: usize| -> Result<()> {
            let keys: Vec<String> = (0..n).map(|k| format!("{prefix}:{k}")).collect();
            send_all(
                con,
                calls_per_key * n,
                |p, i| {
                    p.cmd("QUOTA.WINDOW")
                        .arg(&keys[i % n])
                        .arg(1_000_000_000)
                        .arg(60_000)
                        .arg("PRECISION")
                        .arg(1000)
                        .arg("AT")
                        .arg(at(i, n));
                },
                |v| first_is(v, 1),
            )
        };
        let lua_calls = |con: &mut Connection, prefix: &str, n: usize| -> Result<()> {
            let keys: Vec<String> = (0..n).map(|k| format!("{prefix}:{k}")).collect();
            send_all(
                con,
                calls_per_key * n,
                |p, i| {
                    p.cmd("EVALSHA")
                        .arg(&window)
                        .arg(1)
                        .arg(&keys[i % n])
                        .arg(1_000_000_000)
                        .arg(60_000)
                        .arg(i)
                        .arg(at(i, n));
                },
                |v| is_int(v, 1),
            )
        };
        module_calls(&mut con, "mwarm", warm)?;
        let m0 = settled_memory(&server, &mut con)?;
        module_calls(&mut con, "mw", window_keys)?;
        let m1 = settled_memory(&server, &mut con)?;
        let sample: Vec<String> = (0..window_keys.min(200))
            .map(|k| format!("mw:{k}"))
            .collect();
        r.module_window = PerItem {
            used_memory: (m1 - m0) as f64 / window_keys as f64,
            memory_usage: avg_usage(&mut con, &sample)?,
        };
        lua_calls(&mut con, "lwarm", warm)?;
        let m2 = settled_memory(&server, &mut con)?;
        lua_calls(&mut con, "lw", window_keys)?;
        let m3 = settled_memory(&server, &mut con)?;
        let sample: Vec<String> = (0..window_keys.min(200))
            .map(|k| format!("lw:{k}"))
            .collect();
        r.lua_window = PerItem {
            used_memory: (m3 - m2) as f64 / window_keys as f64,
            memory_usage: avg_usage(&mut con, &sample)?,
        };
        r.lua_window_members = redis::cmd("ZCARD").arg("lw:0").query(&mut con)?;
    }
    Ok(r)
}

/// Sum of `MEMORY USAGE` over every key of every tenant.
fn multi_usage(con: &mut Connection, keys: &[Vec<u8>]) -> Result<f64> {
    let mut sum = 0i64;
    for k in keys {
        sum += memory_usage(con, &String::from_utf8_lossy(k))?;
    }
    Ok(sum as f64)
}

/// Bytes per 5-key reservation (module and Lua): `items` requests spread over [`MEM_KEYS`]
/// tenants, 16-byte ids, pending, then the same ids settled.
fn measure_multi(module: &Path, items: usize, r: &mut MemoryResults) -> Result<()> {
    r.multi_items = items;
    let tenants: Vec<MultiKeys> = (0..MEM_KEYS).map(|k| MultiKeys::new("mm", k)).collect();
    let per_tenant = (items / MEM_KEYS) as f64;
    let per = |m0: i64, m1: i64, u0: f64, u1: f64| PerItem {
        used_memory: (m1 - m0) as f64 / items as f64,
        memory_usage: (u1 - u0) / MEM_KEYS as f64 / per_tenant,
    };
    {
        let server = Server::start(module, "mem-multi", &[])?;
        let mut con = server.connection()?;
        if has_command(&mut con, "quota.mreserve")? && has_command(&mut con, "quota.msettle")? {
            let keys: Vec<Vec<u8>> = tenants.iter().flat_map(|t| t.module.clone()).collect();
            for t in &tenants {
                for (i, k) in t.module.iter().enumerate() {
                    let mut c = redis::cmd("QUOTA.SET");
                    c.arg(k);
                    if i < MULTI_BUDGETS {
                        c.arg("LIMIT")
                            .arg(1_000_000_000_000i64)
                            .arg("TTL")
                            .arg(3_600_000);
                    } else {
                        c.arg("WINDOW")
                            .arg(1_000_000_000_000i64)
                            .arg(MULTI_WINDOW_MS);
                    }
                    c.query::<Value>(&mut con)?;
                }
            }
            let budgets: Vec<Vec<u8>> = tenants
                .iter()
                .flat_map(|t| t.module[..MULTI_BUDGETS].to_vec())
                .collect();
            let windows: Vec<Vec<u8>> = tenants
                .iter()
                .flat_map(|t| t.module[MULTI_BUDGETS..].to_vec())
                .collect();
            let split0 = (
                multi_usage(&mut con, &budgets)?,
                multi_usage(&mut con, &windows)?,
            );
            let m0 = settled_memory(&server, &mut con)?;
            let u0 = multi_usage(&mut con, &keys)?;
            send_all(
                &mut con,
                items,
                |p, i| {
                    let tenant = &tenants[i % MEM_KEYS].module[..];
                    let c = p.cmd("QUOTA.MRESERVE").arg(MULTI_KEYS).arg(tenant);
                    c.arg(&MULTI_AMOUNTS[..]).arg("ID").arg(id16(i));
                },
                |v| first_is(v, 1),
            )?;
            let m1 = settled_memory(&server, &mut con)?;
            let u1 = multi_usage(&mut con, &keys)?;
            let split1 = (
                multi_usage(&mut con, &budgets)?,
                multi_usage(&mut con, &windows)?,
            );
            r.module_multi_split = Some((
                (split1.0 - split0.0) / (items * MULTI_BUDGETS) as f64,
                (split1.1 - split0.1) / (items * (MULTI_KEYS - MULTI_BUDGETS)) as f64,
            ));
            send_all(
                &mut con,
                items,
                |p, i| {
                    let tenant = &tenants[i % MEM_KEYS].module[..];
                    let c = p.cmd("QUOTA.MSETTLE").arg(MULTI_KEYS).arg(tenant);
                    c.arg(id16(i)).arg(&MULTI_ACTUALS[..]);
                },
                |v| matches!(v, Value::Array(a) if a.len() == MULTI_KEYS),
            )?;
            let m2 = settled_memory(&server, &mut con)?;
            let u2 = multi_usage(&mut con, &keys)?;
            r.module_multi = Some((per(m0, m1, u0, u1), per(m0, m2, u0, u2)));
        }
    }
    {
        let server = Server::start(module, "mem-multi-lua", &[])?;
        let mut con = server.connection()?;
        let load = |con: &mut Connection, src: &str| -> Result<String> {
            Ok(redis::cmd("SCRIPT").arg("LOAD").arg(src).query(con)?)
        };
        let mreserve = load(&mut con, MRESERVE_LUA)?;
        let msettle = load(&mut con, MSETTLE_LUA)?;
        let lua_keys = |t: &MultiKeys| t.lua.to_vec();
        for t in &tenants {
            for b in &t.lua[..MULTI_BUDGETS] {
                redis::cmd("HSET")
                    .arg(b)
                    .arg("total")
                    .arg(1_000_000_000_000i64)
                    .arg("used")
                    .arg(0)
                    .arg("reserved")
                    .arg(0)
                    .query::<i64>(&mut con)?;
            }
            for cfg in [&t.lua[4], &t.lua[6]] {
                redis::cmd("HSET")
                    .arg(cfg)
                    .arg("limit")
                    .arg(1_000_000_000_000i64)
                    .arg("window_ms")
                    .arg(MULTI_WINDOW_MS)
                    .arg("sum")
                    .arg(0)
                    .query::<i64>(&mut con)?;
            }
        }
        // The ZSETs exist only once a call was counted: their usage is measured after.
        let keys: Vec<Vec<u8>> = tenants
            .iter()
            .flat_map(|t| {
                lua_keys(t)
                    .into_iter()
                    .filter(|k| !k.ends_with(b"rpm") && !k.ends_with(b"tpm"))
            })
            .collect();
        let zsets: Vec<Vec<u8>> = tenants
            .iter()
            .flat_map(|t| [t.lua[3].clone(), t.lua[5].clone()])
            .collect();
        let detail = |i: usize| format!("{}{}", tenants[i % MEM_KEYS].detail, id16(i));
        let call = |p: &mut redis::Pipeline, sha: &str, i: usize, reserve: bool| {
            let t = &tenants[i % MEM_KEYS];
            let c = p
                .cmd("EVALSHA")
                .arg(sha)
                .arg(1 + t.lua.len())
                .arg(detail(i));
            for k in &t.lua {
                c.arg(k);
            }
            c.arg(MULTI_BUDGETS)
                .arg(MULTI_KEYS - MULTI_BUDGETS)
                .arg(id16(i));
            if reserve {
                c.arg(3600).arg(&MULTI_AMOUNTS[..]);
            } else {
                c.arg(&MULTI_ACTUALS[..]);
            }
        };
        let m0 = settled_memory(&server, &mut con)?;
        let u0 = multi_usage(&mut con, &keys)?;
        send_all(
            &mut con,
            items,
            |p, i| call(p, &mreserve, i, true),
            |v| first_is(v, 1),
        )?;
        let sample: Vec<String> = (0..items)
            .step_by((items / 1000).max(1))
            .map(detail)
            .collect();
        let m1 = settled_memory(&server, &mut con)?;
        let u1 = multi_usage(&mut con, &keys)? + multi_usage(&mut con, &zsets)?;
        let d1 = avg_usage(&mut con, &sample)?;
        send_all(
            &mut con,
            items,
            |p, i| call(p, &msettle, i, false),
            |v| matches!(v, Value::Array(a) if a.len() == MULTI_KEYS),
        )?;
        let m2 = settled_memory(&server, &mut con)?;
        let u2 = multi_usage(&mut con, &keys)? + multi_usage(&mut con, &zsets)?;
        let d2 = avg_usage(&mut con, &sample)?;
        let mut pending = per(m0, m1, u0, u1);
        pending.memory_usage += d1;
        let mut settled = per(m0, m2, u0, u2);
        settled.memory_usage += d2;
        r.lua_multi = (pending, settled);
    }
    Ok(())
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The sweeper with `keys × per_key` pending reservations whose deadlines are spread evenly
/// over `spread`, starting once all are created.
#[derive(Clone, Debug, Default)]
pub struct SweepResult {
    pub effort: i64,
    pub pending_peak: i64,
    /// How many of them expired during the run.
    pub expiring: i64,
    pub spread_ms: i64,
    /// Largest (release − deadline) the sweeper reported, ms.
    pub max_lag_ms: i64,
    /// From the last deadline until nothing was pending, ms (`None`: timed out).
    pub drain_after_last_ms: Option<i64>,
    /// Releases per second while draining.
    pub release_rate: f64,
    /// How long creating the reservations took, ms.
    pub create_ms: i64,
    /// Longest gap between two INFO polls (a sign of the server blocking), ms.
    pub max_poll_gap_ms: i64,
}

/// `every`: one reservation in `every` expires (over `spread_ms`); the others are held for an
/// hour, so the sweeper works among `keys × per_key` pending all along.
#[allow(clippy::too_many_arguments)]
pub fn measure_sweeper(
    module: &Path,
    keys: usize,
    per_key: usize,
    every: usize,
    spread_ms: i64,
    effort: i64,
    create_rate_hint: f64,
) -> Result<SweepResult> {
    let every = every.max(1);
    let effort_arg = effort.to_string();
    let server = Server::start(module, "sweep", &["sweep-effort", &effort_arg])?;
    let mut con = server.connection()?;
    let total = keys * per_key;
    let names: Vec<String> = (0..keys).map(|k| format!("sw:{k}")).collect();
    for k in &names {
        redis::cmd("QUOTA.SET")
            .arg(k)
            .arg("LIMIT")
            .arg(1_000_000_000_000i64)
            .query::<i64>(&mut con)?;
    }
    // Deadlines start after the (estimated, generously) creation time.
    // (Creating slows down as keys fill up: twice the measured RESERVE pace, plus a margin.)
    let est_ms = (total as f64 / create_rate_hint.max(10_000.0) * 2500.0) as i64 + 300;
    let base = now_ms() + est_ms;
    let started = Instant::now();
    let threads = 2usize;
    let client = server.client()?;
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let client = client.clone();
                let names = &names;
                s.spawn(move || -> Result<()> {
                    let mut con = client.get_connection()?;
                    // Item i: key i % keys; deadline base + spread * i / total.
                    let mine: Vec<usize> = (t..total).step_by(threads).collect();
                    for chunk in mine.chunks(PIPELINE) {
                        let now = now_ms();
                        let mut p = redis::pipe();
                        for &i in chunk {
                            let deadline = if i % every == 0 {
                                base + spread_ms * i as i64 / total as i64
                            } else {
                                base + 3_600_000
                            };
                            p.cmd("QUOTA.RESERVE")
                                .arg(&names[i % keys])
                                .arg(1)
                                .arg("TTL")
                                .arg((deadline - now).max(1));
                        }
                        let replies: Vec<Value> = p.query(&mut con)?;
                        if let Some(bad) = replies.iter().find(|v| !first_is(v, 1)) {
                            return Err(format!("unexpected reply {bad:?}").into());
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap_or_else(|_| Err("worker panicked".into()))?;
        }
        Ok(())
    })?;
    let create_ms = started.elapsed().as_millis() as i64;
    let created_at = now_ms();
    if created_at > base {
        eprintln!(
            "bench: warning: creating {total} reservations took {create_ms} ms, past the first \
             deadline by {} ms",
            created_at - base
        );
    }
    let pending_peak = info_i64(&mut con, "quota", "quota_pending_reservations")?;
    let expiring = i64::try_from(total.div_ceil(every)).unwrap_or(i64::MAX);
    // What stays pending once every expiring one is released (known, not measured: a few may
    // have expired before the peak was read).
    let kept = i64::try_from(total).unwrap_or(i64::MAX) - expiring;
    let last_deadline = base + spread_ms;
    // Generous: the sweeper's nominal rate (effort per 50 ms tick) with a 3x margin.
    let nominal = (effort.max(1) * 20) as f64;
    let timeout = Duration::from_millis(
        (spread_ms + est_ms) as u64 + (expiring as f64 / nominal * 3000.0) as u64 + 10_000,
    );
    let mut drain_after_last_ms = None;
    let mut first_release: Option<(Instant, i64)> = None;
    let mut last_poll = Instant::now();
    let mut max_gap = 0i64;
    let mut end_pending = pending_peak;
    let poll_start = Instant::now();
    while poll_start.elapsed() < timeout {
        std::thread::sleep(Duration::from_millis(20));
        let q = info(&mut con, "quota")?;
        let gap = last_poll.elapsed().as_millis() as i64;
        max_gap = max_gap.max(gap);
        last_poll = Instant::now();
        let pending: i64 = q
            .get("quota_pending_reservations")
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1);
        if first_release.is_none() && pending < pending_peak {
            first_release = Some((Instant::now(), pending));
        }
        end_pending = pending;
        if pending <= kept {
            drain_after_last_ms = Some((now_ms() - last_deadline).max(0));
            break;
        }
    }
    let max_lag_ms = info_i64(&mut con, "quota", "quota_sweeper_max_lag_ms")?;
    let release_rate = match first_release {
        Some((t, p)) => (p - end_pending) as f64 / t.elapsed().as_secs_f64().max(1e-3),
        None => 0.0,
    };
    Ok(SweepResult {
        effort,
        pending_peak,
        expiring,
        spread_ms,
        max_lag_ms,
        drain_after_last_ms,
        release_rate,
        create_ms,
        max_poll_gap_ms: max_gap,
    })
}
