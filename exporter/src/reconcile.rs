//! `quota-export reconcile`: for each budget key in the database, the sum of `charged` in the
//! current period against `QUOTA.INFO`'s `used`; and for each stream, whether entries were
//! trimmed before the group read them (lost before export) or are still waiting.

use redis::Value;

use crate::consumer::{group_info, pairs};
use crate::db::Db;
use crate::entry::{self, parse_stream_id};
use crate::Error;

/// One budget key's line of the table.
#[derive(Debug)]
pub struct Line {
    pub key: String,
    pub period_start: i64,
    pub db_sum: i64,
    /// `None`: the key is gone from Redis.
    pub used: Option<i64>,
}

impl Line {
    pub fn matches(&self) -> bool {
        self.used.is_none_or(|u| u == self.db_sum)
    }
}

/// Runs the check and prints the table; returns whether everything matched and nothing was
/// lost.
pub fn reconcile(redis_url: &str, db_target: &str, group: &str) -> Result<bool, Error> {
    let mut con = redis::Client::open(redis_url)?.get_connection()?;
    let mut db = Db::open(db_target)?;
    let pairs_in_db = db.keys()?;
    let mut keys: Vec<String> = pairs_in_db.iter().map(|(k, _)| k.clone()).collect();
    keys.dedup();
    let mut streams: Vec<String> = pairs_in_db.iter().map(|(_, s)| s.clone()).collect();
    let mut lines = Vec::new();
    for key in keys {
        let info: Value = redis::cmd("QUOTA.INFO").arg(&key).query(&mut con)?;
        let fields = pairs(&info);
        let int = |f: &str| {
            fields
                .iter()
                .find(|(k, _)| k == f)
                .and_then(|(_, v)| entry::text_of(v))
                .and_then(|t| t.parse::<i64>().ok())
        };
        if let Some(s) = fields
            .iter()
            .find(|(k, _)| k == "stream")
            .and_then(|(_, v)| entry::text_of(v))
            .filter(|s| !s.is_empty())
        {
            streams.push(s);
        }
        let used = int("used");
        let period_start = int("period_start_ms").unwrap_or(-1);
        let db_sum = db.charged(&key, period_start)?;
        lines.push(Line {
            key,
            period_start,
            db_sum,
            used,
        });
    }
    streams.sort();
    streams.dedup();

    let width = lines.iter().map(|l| l.key.len()).max().unwrap_or(3).max(3);
    println!(
        "{:<width$}  {:>14}  {:>14}  {:>14}  {:>10}  status",
        "key", "period_start", "db_charged", "used", "diff"
    );
    let mut ok = true;
    for l in &lines {
        let (used, diff, status) = match l.used {
            Some(u) => (
                u.to_string(),
                (i128::from(u) - i128::from(l.db_sum)).to_string(),
                if u == l.db_sum { "ok" } else { "MISMATCH" },
            ),
            None => ("-".into(), "-".into(), "gone (no budget at this key)"),
        };
        ok &= l.matches();
        println!(
            "{:<width$}  {:>14}  {:>14}  {:>14}  {:>10}  {status}",
            l.key, l.period_start, l.db_sum, used, diff
        );
    }

    let mut waiting = false;
    for s in &streams {
        let stream: redis::RedisResult<Value> =
            redis::cmd("XINFO").arg("STREAM").arg(s).query(&mut con);
        let Ok(stream) = stream else {
            println!("stream {s}: missing in Redis");
            continue;
        };
        let sp = pairs(&stream);
        let text = |f: &str| {
            sp.iter()
                .find(|(k, _)| k == f)
                .and_then(|(_, v)| entry::text_of(v))
        };
        let max_deleted = text("max-deleted-entry-id").and_then(|t| parse_stream_id(&t));
        let groups: Value = redis::cmd("XINFO").arg("GROUPS").arg(s).query(&mut con)?;
        let Some(g) = group_info(&groups, group) else {
            println!(
                "stream {s}: no consumer group {group:?}: nothing of it was exported by that group"
            );
            ok = false;
            continue;
        };
        let read = parse_stream_id(&g.last_delivered).unwrap_or((0, 0));
        let int = |f: &str| text(f).and_then(|t| t.parse::<i64>().ok());
        let first = text("recorded-first-entry-id").and_then(|t| parse_stream_id(&t));
        // Trimming deletes from the head and leaves max-deleted-entry-id alone (XDEL sets
        // it): entries added after the group's position, minus those still there, were
        // trimmed unread.
        let trimmed_unread = match (int("entries-added"), g.entries_read, int("length")) {
            (Some(added), Some(read_n), Some(len)) if first.is_none_or(|f| f > read) => {
                added - read_n - len
            }
            _ => 0,
        };
        if max_deleted.is_some_and(|d| d > read) || trimmed_unread > 0 {
            println!(
                "stream {s}: TRIMMED PAST THE GROUP: {} entries were deleted (STREAMMAXLEN, XDEL) \
                 before group {group:?} had read them (it had read up to {}): those entries were \
                 lost before export, and the database cannot match Redis",
                if trimmed_unread > 0 {
                    trimmed_unread.to_string()
                } else {
                    "some".into()
                },
                g.last_delivered
            );
            ok = false;
        }
        let lag = g.lag.unwrap_or(-1);
        if lag != 0 || g.pending != 0 {
            waiting = true;
            println!(
                "stream {s}: not yet exported: lag {} unread, {} pending (run `quota-export run --once` first)",
                if lag < 0 { "unknown".to_string() } else { lag.to_string() },
                g.pending
            );
        }
    }
    let (rows, rejects) = db.counts()?;
    println!("database: {rows} usage rows, {rejects} malformed entries skipped");
    if ok {
        println!("reconcile: OK");
    } else if waiting {
        println!("reconcile: FAILED (some entries are not exported yet)");
    } else {
        println!("reconcile: FAILED");
    }
    Ok(ok)
}
