//! `quota-export reconcile`: for each budget key in the database, the sum of `charged` in the
//! current period against `QUOTA.INFO`'s `used`; and for each stream, whether entries were
//! lost before export or are still waiting. Two kinds of loss: entries trimmed before the
//! group read them (Redis' counters: entries added − read − still unread), and entries
//! deleted while pending (recorded by `run` in `quota_usage_rejects`).
//!
//! Verdict (exit status): 0 only when at least one budget key of the database was compared
//! and every compared key matched, with nothing lost; 1 on a mismatch, on entries lost
//! before export, or when nothing could be compared (no usage rows, or none of the
//! database's budget keys exists in this Redis); 2 (an `Err`) when the database or Redis
//! cannot be read (a database that does not exist is never created).

use redis::Value;

use crate::consumer::{connect, group_info, pairs, GroupInfo};
use crate::db::{redact, Db};
use crate::entry::{self, parse_stream_id};
use crate::Error;

/// One budget key's line of the table.
#[derive(Debug)]
pub struct Line {
    pub key: String,
    /// The streams this key's entries came from (the database's, and `QUOTA.INFO`'s now).
    pub streams: Vec<String>,
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

/// Whether entries were deleted before the group read them.
#[derive(Debug, PartialEq)]
enum Trim {
    /// Nothing lost.
    None,
    /// Entries lost before export: how many, when Redis' counters tell.
    Lost(Option<i64>),
    /// The check could not be made; why.
    Unknown(String),
}

/// What reconcile found about one stream.
#[derive(Debug)]
enum StreamState {
    Missing,
    WrongType(String),
    NoGroup,
    Checked {
        group: GroupInfo,
        trim: Trim,
        /// Entries after the group's position still in the stream (not read yet).
        unread: i64,
        /// Entries read by the group but deleted before `run` stored them (its record in
        /// `quota_usage_rejects`).
        deleted_pending: i64,
    },
}

impl StreamState {
    /// Did this stream lose entries before export (either kind)?
    fn lost(&self) -> bool {
        matches!(
            self,
            StreamState::Checked {
                trim: Trim::Lost(_),
                ..
            }
        ) || matches!(self, StreamState::Checked { deleted_pending, .. } if *deleted_pending > 0)
    }
}

/// Entries of `stream` with an id after `after` (counted in pages, so a long backlog costs
/// round trips, not memory).
fn count_after(con: &mut redis::Connection, stream: &str, after: &str) -> Result<i64, Error> {
    const PAGE: usize = 10_000;
    let mut from = after.to_string();
    let mut n: i64 = 0;
    loop {
        let reply: Value = redis::cmd("XRANGE")
            .arg(stream)
            .arg(format!("({from}"))
            .arg("+")
            .arg("COUNT")
            .arg(PAGE)
            .query(con)?;
        let (entries, _) = entry::parse_entries(&reply);
        let got = entries.len();
        n = n.saturating_add(i64::try_from(got).unwrap_or(i64::MAX));
        match entries.last() {
            Some(e) if got == PAGE => from = e.id.clone(),
            _ => return Ok(n),
        }
    }
}

fn check_stream(
    con: &mut redis::Connection,
    db: &mut Db,
    s: &str,
    group: &str,
    replica: bool,
) -> Result<StreamState, Error> {
    let kind: String = redis::cmd("TYPE").arg(s).query(con)?;
    match kind.as_str() {
        "none" => return Ok(StreamState::Missing),
        "stream" => {}
        other => return Ok(StreamState::WrongType(other.to_string())),
    }
    let stream: Value = redis::cmd("XINFO").arg("STREAM").arg(s).query(con)?;
    let sp = pairs(&stream);
    let text = |f: &str| {
        sp.iter()
            .find(|(k, _)| k == f)
            .and_then(|(_, v)| entry::text_of(v))
    };
    let int = |f: &str| text(f).and_then(|t| t.parse::<i64>().ok());
    let groups: Value = redis::cmd("XINFO").arg("GROUPS").arg(s).query(con)?;
    let Some(g) = group_info(&groups, group) else {
        return Ok(StreamState::NoGroup);
    };
    let read = parse_stream_id(&g.last_delivered).unwrap_or((0, 0));
    let len = int("length").unwrap_or(0);
    let first = text("recorded-first-entry-id")
        .and_then(|t| parse_stream_id(&t))
        .or_else(|| pairs_first_id(&sp));
    let last = text("last-generated-id").and_then(|t| parse_stream_id(&t));
    // Entries still waiting: those after the group's position (Redis' own `lag` also counts
    // the entries trimmed unread, which no run can export).
    let unread = if len == 0 || last.is_none_or(|l| l <= read) {
        0
    } else if first.is_some_and(|f| f > read) {
        len
    } else {
        count_after(con, s, &g.last_delivered)?
    };
    // XDEL (not trimming) sets max-deleted-entry-id; after the group's position it deleted
    // unread entries.
    let xdel_unread = text("max-deleted-entry-id")
        .and_then(|t| parse_stream_id(&t))
        .is_some_and(|d| d != (0, 0) && d > read);
    // Every entry ever added was read by the group (entries-read), is still waiting after
    // its position, or was deleted unread: the difference is what was lost, before and
    // after the group caught up.
    let trim = match (int("entries-added"), g.entries_read) {
        (Some(added), Some(read_n)) => {
            let lost = added.saturating_sub(read_n).saturating_sub(unread);
            if lost > 0 {
                Trim::Lost(Some(lost))
            } else if xdel_unread {
                Trim::Lost(None)
            } else {
                Trim::None
            }
        }
        _ if xdel_unread => Trim::Lost(None),
        _ => Trim::Unknown(if replica {
            format!(
                "XINFO GROUPS gives no entries-read for group {group:?}: this server is a \
                 replica, and Redis 7.0 replicas do not keep it; run reconcile against the master"
            )
        } else {
            format!(
                "XINFO GROUPS gives no entries-read for group {group:?} (Redis cannot count \
                 its reads, e.g. after XDEL past its position or XGROUP SETID without \
                 ENTRIESREAD)"
            )
        }),
    };
    // A replica's copy of the group's counters can lag its master's (a resync, a read not
    // replicated yet): a loss seen there is not certain.
    let trim = match trim {
        Trim::Lost(_) if replica => Trim::Unknown(format!(
            "this server is a replica: its copy of group {group:?}'s counters can lag the \
             master's, so the loss they suggest is not certain; run reconcile against the master"
        )),
        t => t,
    };
    Ok(StreamState::Checked {
        group: g,
        trim,
        unread,
        deleted_pending: db.deleted_while_pending(s)?,
    })
}

/// The id of the stream's first entry (`first-entry` in `XINFO STREAM`), if any.
fn pairs_first_id(sp: &[(String, &Value)]) -> Option<(u64, u64)> {
    let (_, v) = sp.iter().find(|(k, _)| k == "first-entry")?;
    let Value::Array(e) = v else { return None };
    parse_stream_id(&entry::text_of(e.first()?)?)
}

/// Is the server a replica (`ROLE`)?
fn is_replica(con: &mut redis::Connection) -> bool {
    let role: redis::RedisResult<Value> = redis::cmd("ROLE").query(con);
    match role {
        Ok(Value::Array(v)) => v
            .first()
            .and_then(entry::text_of)
            .is_some_and(|r| r == "slave"),
        _ => false,
    }
}

/// Runs the check and prints the table; returns whether everything matched and nothing was
/// lost (see the module docs for the exact rule).
pub fn reconcile(redis_url: &str, db_target: &str, group: &str) -> Result<bool, Error> {
    let mut db = Db::open_existing(db_target)?;
    let mut con = connect(redis_url)?;
    let replica = is_replica(&mut con);
    if replica {
        println!(
            "note: {} is a replica: reconcile (like run) belongs on the master \
             (a Redis 7.0 replica does not keep the group's entries-read)",
            redact(redis_url)
        );
    }
    let pairs_in_db = db.keys()?;
    let mut lines: Vec<Line> = Vec::new();
    for (key, stream) in &pairs_in_db {
        match lines.last_mut() {
            Some(l) if &l.key == key => l.streams.push(stream.clone()),
            _ => lines.push(Line {
                key: key.clone(),
                streams: vec![stream.clone()],
                period_start: -1,
                db_sum: 0,
                used: None,
            }),
        }
    }
    let mut streams: Vec<String> = pairs_in_db.iter().map(|(_, s)| s.clone()).collect();
    for l in &mut lines {
        let info: Value = redis::cmd("QUOTA.INFO").arg(&l.key).query(&mut con)?;
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
            l.streams.push(s.clone());
            streams.push(s);
        }
        l.used = int("used");
        // A key gone from Redis: its latest period in the database.
        l.period_start = match l.used {
            Some(_) => int("period_start_ms").unwrap_or(-1),
            None => db.latest_period(&l.key)?,
        };
        l.db_sum = db.charged(&l.key, l.period_start)?;
    }
    streams.sort();
    streams.dedup();
    let mut states = Vec::new();
    for s in &streams {
        states.push((
            s.clone(),
            check_stream(&mut con, &mut db, s, group, replica)?,
        ));
    }
    let state_of = |s: &String| states.iter().find(|(n, _)| n == s).map(|(_, st)| st);

    let width = lines.iter().map(|l| l.key.len()).max().unwrap_or(3).max(3);
    println!(
        "{:<width$}  {:>14}  {:>14}  {:>14}  {:>10}  status",
        "key", "period_start", "db_charged", "used", "diff"
    );
    let mut ok = true;
    let mut compared = 0usize;
    // Mismatched keys no stream state explains.
    let mut unexplained = 0usize;
    for l in &lines {
        let (used, diff, status) = match l.used {
            Some(u) => {
                compared += 1;
                let status = if u == l.db_sum {
                    "ok".to_string()
                } else {
                    // Say why when a stream of this key tells.
                    let why = l.streams.iter().find_map(|s| match state_of(s) {
                        Some(st) if st.lost() => {
                            Some(format!(" (entries trimmed from {s} before export)"))
                        }
                        Some(StreamState::Checked {
                            trim: Trim::Unknown(_),
                            ..
                        }) => Some(format!(" (trim check of {s} not possible, see below)")),
                        Some(StreamState::Checked { group, unread, .. })
                            if *unread > 0 || group.pending > 0 =>
                        {
                            Some(format!(" (entries of {s} not exported yet)"))
                        }
                        Some(StreamState::Missing) => Some(format!(" (stream {s} missing)")),
                        Some(StreamState::NoGroup) => Some(format!(" (no group {group:?} on {s})")),
                        Some(StreamState::WrongType(_)) => Some(format!(" ({s} is not a stream)")),
                        _ => None,
                    });
                    if why.is_none() {
                        unexplained += 1;
                    }
                    format!("MISMATCH{}", why.unwrap_or_default())
                };
                (
                    u.to_string(),
                    (i128::from(u) - i128::from(l.db_sum)).to_string(),
                    status,
                )
            }
            None => (
                "-".into(),
                "-".into(),
                "gone (no budget at this key)".to_string(),
            ),
        };
        ok &= l.matches();
        println!(
            "{:<width$}  {:>14}  {:>14}  {:>14}  {:>10}  {status}",
            l.key, l.period_start, l.db_sum, used, diff
        );
    }

    let mut waiting = false;
    let mut lost = false;
    let mut no_group = 0usize;
    let mut wrong_type = 0usize;
    let mut unchecked = false;
    for (s, st) in &states {
        match st {
            StreamState::Missing => println!(
                "stream {s}: missing in Redis (deleted, or --redis names another server or \
                 database number)"
            ),
            StreamState::WrongType(t) => {
                println!("stream {s}: the key holds a {t}, not a stream");
                wrong_type += 1;
                ok = false;
            }
            StreamState::NoGroup => {
                println!(
                    "stream {s}: no consumer group {group:?}: nothing of it was exported by that group"
                );
                no_group += 1;
                ok = false;
            }
            StreamState::Checked {
                group: g,
                trim,
                unread,
                deleted_pending,
            } => {
                match trim {
                    Trim::None => {}
                    Trim::Lost(n) => {
                        println!(
                            "stream {s}: TRIMMED PAST THE GROUP: {} entries were deleted \
                             (STREAMMAXLEN, XDEL) before group {group:?} had read them (it has \
                             read up to {}): those entries were lost before export, and the \
                             database cannot match Redis; exporting again cannot bring them back",
                            n.map_or_else(|| "some".to_string(), |n| n.to_string()),
                            g.last_delivered
                        );
                        lost = true;
                        ok = false;
                    }
                    Trim::Unknown(why) => {
                        println!("stream {s}: trim check not possible: {why}");
                        unchecked = true;
                    }
                }
                if *deleted_pending > 0 {
                    println!(
                        "stream {s}: DELETED WHILE PENDING: {deleted_pending} entries were read \
                         by group {group:?} but deleted from the stream (STREAMMAXLEN, XDEL) \
                         before they were stored (recorded in quota_usage_rejects): lost \
                         before export"
                    );
                    lost = true;
                    ok = false;
                }
                if *unread != 0 || g.pending != 0 {
                    waiting = true;
                    println!(
                        "stream {s}: not yet exported: {unread} unread, {} pending (run \
                         `quota-export run --once` first)",
                        g.pending
                    );
                }
            }
        }
    }
    let (rows, malformed, deleted) = db.counts()?;
    println!(
        "database: {rows} usage rows, {malformed} malformed entries skipped, {deleted} entries \
         deleted while pending"
    );
    if rows == 0 {
        println!(
            "reconcile: FAILED (nothing to compare: the database has no usage rows; \
             is --db the database `quota-export run` writes to?)"
        );
        return Ok(false);
    }
    if compared == 0 {
        println!(
            "reconcile: FAILED (nothing to compare: none of the database's {} budget keys \
             exists in this Redis; is --redis the right server and database number?)",
            lines.len()
        );
        return Ok(false);
    }
    let unchecked_note =
        "whether entries were trimmed before export could not be checked, see above";
    if ok {
        if unchecked {
            println!("reconcile: OK (every budget matches; {unchecked_note})");
        } else {
            println!("reconcile: OK");
        }
        return Ok(true);
    }
    let mut reasons: Vec<String> = Vec::new();
    if lost {
        reasons.push(
            "entries were trimmed from the stream before export: lost, the database cannot \
             match Redis"
                .into(),
        );
    }
    if waiting {
        reasons.push(if lost {
            "some entries are also not exported yet".into()
        } else {
            "some entries are not exported yet".into()
        });
    }
    if no_group > 0 {
        reasons.push(format!(
            "no consumer group {group:?} on {no_group} stream(s): is --group the group \
             `quota-export run` uses?"
        ));
    }
    if wrong_type > 0 {
        reasons.push(format!("{wrong_type} stream key(s) hold another type"));
    }
    if unexplained > 0 {
        reasons.push(format!(
            "{unexplained} budget key(s) do not match and no backlog or loss seen explains \
             it: charged before their STREAM was set, a loss acknowledged with XGROUP SETID, \
             or rows written to another database?"
        ));
    }
    if unchecked {
        reasons.push(unchecked_note.into());
    }
    if reasons.is_empty() {
        reasons.push("budget keys do not match, see the table".into());
    }
    println!("reconcile: FAILED ({})", reasons.join("; "));
    Ok(false)
}
