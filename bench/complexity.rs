//! The O(log n) goal with a backlog: a read of a key whose reservations have all expired but
//! not been released (sweeper off, nobody writing) must cost about what it costs when none
//! has, at any size. Before round 9 the view walked the expired ones (O(expired) a call);
//! the deadline index now sums them in one descent.

use std::path::Path;

use redis::Connection;

use crate::server::{command_stats, Server};
use crate::Result;

/// The calls timed per measurement (pipelined).
pub const CALLS: usize = 5_000;
const PIPELINE: usize = 100;
/// Reservation TTL; reads run at `T0 + TTL / 2` (none expired) and `T0 + 2 × TTL` (all).
const TTL_MS: i64 = 1_000;
const T0: i64 = 1_800_000_000_000;

/// QUOTA.INFO server cost on one key holding `pending` reservations.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExpiredRead {
    pub pending: usize,
    /// µs a call with none of them expired.
    pub none_expired_us: f64,
    /// µs a call with all of them expired and unreleased.
    pub all_expired_us: f64,
}

/// For each size: a fresh key with that many reservations (test clock, sweeper off), then
/// `QUOTA.INFO` timed before and after their deadlines.
pub fn measure_expired_reads(module: &Path, sizes: &[usize]) -> Result<Vec<ExpiredRead>> {
    let server = Server::start(
        module,
        "complexity",
        &["test-clock", "yes", "sweep-effort", "0"],
    )?;
    let mut con = server.connection()?;
    let mut out = Vec::new();
    for &pending in sizes {
        let key = format!("cx:{pending}");
        redis::cmd("QUOTA.SET")
            .arg(&key)
            .arg("LIMIT")
            .arg(1_000_000_000_000i64)
            .arg("AT")
            .arg(T0)
            .query::<i64>(&mut con)?;
        let mut made = 0;
        while made < pending {
            let mut p = redis::pipe();
            for _ in 0..PIPELINE.min(pending - made) {
                p.cmd("QUOTA.RESERVE")
                    .arg(&key)
                    .arg(1)
                    .arg("TTL")
                    .arg(TTL_MS)
                    .arg("AT")
                    .arg(T0)
                    .ignore();
                made += 1;
            }
            p.query::<()>(&mut con)?;
        }
        let none_expired_us = info_cost(&mut con, &key, T0 + TTL_MS / 2, pending, 0)?;
        let all_expired_us = info_cost(&mut con, &key, T0 + 2 * TTL_MS, 0, pending)?;
        out.push(ExpiredRead {
            pending,
            none_expired_us,
            all_expired_us,
        });
    }
    Ok(out)
}

/// Server µs per `QUOTA.INFO key AT at`, after checking the reply shows `live` pending
/// reservations and `expired` units no longer reserved (so the backlog is really there).
fn info_cost(con: &mut Connection, key: &str, at: i64, live: usize, expired: usize) -> Result<f64> {
    let reply: Vec<redis::Value> = redis::cmd("QUOTA.INFO")
        .arg(key)
        .arg("AT")
        .arg(at)
        .query(con)?;
    let field = |name: &str| -> Option<i64> {
        reply.chunks(2).find_map(|kv| match kv {
            [redis::Value::BulkString(k), redis::Value::Int(v)]
                if k.as_slice() == name.as_bytes() =>
            {
                Some(*v)
            }
            _ => None,
        })
    };
    if field("pending") != Some(live as i64) || field("reserved") != Some(live as i64) {
        return Err(format!(
            "{key} at {at}: expected {live} live of {} (expired {expired}), got {reply:?}",
            live + expired
        )
        .into());
    }
    redis::cmd("CONFIG").arg("RESETSTAT").query::<()>(con)?;
    let mut done = 0;
    while done < CALLS {
        let mut p = redis::pipe();
        for _ in 0..PIPELINE.min(CALLS - done) {
            p.cmd("QUOTA.INFO").arg(key).arg("AT").arg(at).ignore();
            done += 1;
        }
        p.query::<()>(con)?;
    }
    let (calls, usec) = command_stats(con, "quota.info")?;
    Ok(usec as f64 / calls.max(1) as f64)
}
