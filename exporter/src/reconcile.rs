//! `quota-export reconcile`: for each budget key in the database, the sum of `charged` in the
//! current period against `QUOTA.INFO`'s `used`; and for each stream, whether entries were
//! lost before export or are still waiting.
//!
//! Two kinds of loss. *Trimmed before the group read them*: Redis' counters say entries
//! added − read − still unread, and the database must agree that it lacks at least as many
//! (a re-created group reads again what the database already holds). *Deleted while
//! pending*: recorded by `run` in `quota_usage_rejects`. When Redis' read counter cannot be
//! trusted (none, a replica's copy, or estimated by Redis after an `XDEL`), the database alone
//! tells whether entries are missing, without telling why.
//!
//! Verdict (exit status): 0 only when at least one budget key of the database was compared,
//! every compared key matched, and nothing was lost or is possibly lost; 1 otherwise (a
//! mismatch, a loss, a loss that cannot be ruled out, nothing to compare); 2 (an `Err`) when
//! the database or Redis cannot be read (a database that does not exist is never created).

use redis::Value;

/// `println!` that returns an error instead of panicking when stdout cannot be written (a
/// closed pipe, a full disk): the verdict must stay one of the documented statuses.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)
            .map_err(|e| format!("writing the report to stdout: {e}"))?
    }};
}

use crate::consumer::{connect, group_info, pairs, GroupInfo};
use crate::db::{redact, Db, Timeout};
use crate::entry::{self, parse_stream_id};
use crate::Error;

/// What Redis says of one budget key of the database.
#[derive(Debug)]
enum Now {
    /// A budget: its `used`.
    Used(i64),
    /// No budget at this key (deleted, or a window key now).
    Gone,
    /// The key holds another type now.
    OtherType,
    /// The key's name is not UTF-8: the database holds it with U+FFFD, so it cannot be looked
    /// up.
    NotUtf8,
}

/// One budget key's line of the table.
#[derive(Debug)]
struct Line {
    key: String,
    /// The streams this key's entries came from (the database's, and `QUOTA.INFO`'s now).
    streams: Vec<String>,
    period_start: i64,
    db_sum: i64,
    now: Now,
    /// `used` changed while reconcile read the key again (charges coming in).
    moving: bool,
}

/// Whether entries were deleted before the group read them.
#[derive(Debug, PartialEq)]
enum Trim {
    /// Nothing lost.
    None,
    /// Entries lost before export: how many, when known.
    Lost(Option<i64>),
    /// Redis' counters cannot tell (why), and the database lacks between this many of the
    /// entries the stream received (`None`: not known either).
    Unknown(String, Option<(i64, i64)>),
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
        /// `quota_usage_rejects`, and pending entries below the stream's first entry).
        deleted_pending: i64,
        /// Pending entries not stored yet (and not deleted).
        pending_waiting: i64,
    },
}

impl StreamState {
    /// Did this stream lose entries before export (either kind)?
    fn lost(&self) -> bool {
        match self {
            StreamState::Checked {
                trim,
                deleted_pending,
                ..
            } => matches!(trim, Trim::Lost(_)) || *deleted_pending > 0,
            _ => false,
        }
    }
}

/// Entries read per `XRANGE` when counting a backlog.
const PAGE: usize = 10_000;

/// Entries of `stream` with an id after `after`, up to `end` included (counted in pages, so a
/// long backlog costs round trips, not memory).
fn count_between(
    con: &mut redis::Connection,
    stream: &str,
    after: &str,
    end: &str,
) -> Result<i64, Error> {
    let mut from = after.to_string();
    let mut n: i64 = 0;
    loop {
        let reply: Value = redis::cmd("XRANGE")
            .arg(stream)
            .arg(format!("({from}"))
            .arg(end)
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

/// The id of the stream's first entry (`first-entry` of `XINFO STREAM`), if any.
fn first_entry(stream: &[(String, &Value)]) -> Option<(u64, u64)> {
    stream
        .iter()
        .find(|(k, _)| k == "first-entry")
        .and_then(|(_, v)| match v {
            Value::Array(e) => e.first().and_then(entry::text_of),
            _ => None,
        })
        .and_then(|t| parse_stream_id(&t))
}

/// One moment's view of a stream and its group.
struct Snapshot<'a> {
    stream: Vec<(String, &'a Value)>,
    group: GroupInfo,
    /// The first entries after the group's position (at most [`PAGE`]).
    page: Vec<entry::RawEntry>,
}

impl Snapshot<'_> {
    fn text(&self, f: &str) -> Option<String> {
        self.stream
            .iter()
            .find(|(k, _)| k == f)
            .and_then(|(_, v)| entry::text_of(v))
    }
    fn int(&self, f: &str) -> Option<i64> {
        self.text(f).and_then(|t| t.parse::<i64>().ok())
    }
    fn id(&self, f: &str) -> Option<(u64, u64)> {
        self.text(f).and_then(|t| parse_stream_id(&t))
    }
}

/// One measurement of a stream against the database.
struct Measure {
    group: GroupInfo,
    /// Entries after the group's position at the snapshot.
    unread: i64,
    /// `entries-added` at the snapshot.
    added: Option<i64>,
    /// The group's position.
    read: (u64, u64),
    /// `max-deleted-entry-id` when not `0-0` (an `XDEL` happened), and as text.
    max_deleted: Option<((u64, u64), String)>,
    /// A backlog longer than a page was trimmed while it was counted.
    count_raced: bool,
    /// Entries up to the group's position at the snapshot the database accounts for, read
    /// after it (entries after that position, stored since, do not count).
    accounted: i64,
    /// Pending entries the database holds (stored, not acknowledged yet), when the pending
    /// list was read whole.
    pending_held: Option<i64>,
    /// Pending entries deleted from the stream (below its first entry) and not in the
    /// database: lost, not yet recorded by `run`.
    pending_gone: i64,
}

impl Measure {
    /// What the database lacks of the entries up to the group's position (each of them is
    /// pending, in the database, or lost): entries added − unread − pending not in the
    /// database − the database's entries up to the position. Exact (`lo == hi`) when the
    /// whole pending list was read; else pending entries stored since the snapshot widen it.
    /// `None` when the database holds more of this stream up to the position than it ever
    /// received there: rows of an earlier stream of that name (deleted and re-created), which
    /// say nothing of this one.
    fn missing(&self) -> Option<(i64, i64)> {
        let (pending, slack) = match self.pending_held {
            Some(held) => (self.group.pending.saturating_sub(held), 0),
            None => (self.group.pending, self.group.pending),
        };
        let up_to_position = self.added.map(|a| a.saturating_sub(self.unread));
        up_to_position.filter(|n| self.accounted <= *n).map(|n| {
            let lo = n.saturating_sub(self.accounted).saturating_sub(pending);
            (lo, lo.saturating_add(slack))
        })
    }

    /// Pending entries still to be stored: not in the database, not gone.
    fn pending_waiting(&self) -> i64 {
        self.group
            .pending
            .saturating_sub(self.pending_held.unwrap_or(0))
            .saturating_sub(self.pending_gone)
            .max(0)
    }
}

/// Reads the stream's counters, the group's and the entries after `after` (the group's
/// position a moment before: it only moves forward) in one MULTI/EXEC, so that entries added
/// or read meanwhile cannot hide a loss; then what the database holds up to the snapshot's
/// last entry. `None`: the group is gone.
fn measure(
    con: &mut redis::Connection,
    db: &mut Db,
    s: &str,
    group: &str,
    after: &str,
) -> Result<Option<Measure>, Error> {
    let replies: redis::RedisResult<(Value, Value, Value, Value)> = redis::pipe()
        .atomic()
        .cmd("XINFO")
        .arg("STREAM")
        .arg(s)
        .cmd("XINFO")
        .arg("GROUPS")
        .arg(s)
        .cmd("XRANGE")
        .arg(s)
        .arg(format!("({after}"))
        .arg("+")
        .arg("COUNT")
        .arg(PAGE)
        .cmd("XPENDING")
        .arg(s)
        .arg(group)
        .arg("-")
        .arg("+")
        .arg(PAGE)
        .query(con);
    let (stream, groups, page, pel) = match replies {
        Ok(r) => r,
        Err(e) if e.code() == Some("NOGROUP") => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let Some(g) = group_info(&groups, group) else {
        return Ok(None);
    };
    // The pending ids (XPENDING's extended form: [id, consumer, idle, deliveries] each).
    let pending_ids: Vec<String> = match &pel {
        Value::Array(items) => items
            .iter()
            .filter_map(|i| match i {
                Value::Array(f) => f.first().and_then(entry::text_of),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    let snap = Snapshot {
        stream: pairs(&stream),
        group: g,
        page: entry::parse_entries(&page).0,
    };
    let last = snap.text("last-generated-id").unwrap_or_default();
    let read = parse_stream_id(&snap.group.last_delivered).unwrap_or((0, 0));
    // The page starts at `after`: the entries after the group's position at the snapshot.
    let after_read: Vec<&entry::RawEntry> = snap
        .page
        .iter()
        .filter(|e| parse_stream_id(&e.id).is_some_and(|id| id > read))
        .collect();
    let first_counted = after_read.first().and_then(|e| parse_stream_id(&e.id));
    let mut unread = i64::try_from(after_read.len()).unwrap_or(i64::MAX);
    // A backlog longer than a page: the rest counted up to the snapshot's last entry. Only
    // trimming can change that range meanwhile, and only from its start: if the stream's
    // first entry is still at or before the first one counted, the count is exact.
    let mut count_raced = false;
    if snap.page.len() >= PAGE {
        let from = match snap.page.last() {
            Some(e) if parse_stream_id(&e.id).is_some_and(|id| id > read) => e.id.clone(),
            _ => snap.group.last_delivered.clone(),
        };
        unread = unread.saturating_add(count_between(con, s, &from, &last)?);
        let now: Value = redis::cmd("XINFO").arg("STREAM").arg(s).query(con)?;
        let first_now = first_entry(&pairs(&now));
        count_raced = first_now.is_none_or(|f| first_counted.is_none_or(|c| f > c));
    }
    let upto = read;
    let complete = i64::try_from(pending_ids.len()).is_ok_and(|n| n >= snap.group.pending);
    let (accounted, held) = db.accounted_and_held(s, upto, &pending_ids)?;
    // Pending entries below the stream's first entry (or all, in an empty stream) were
    // trimmed while pending.
    let empty = snap.int("length") == Some(0);
    let first = first_entry(&snap.stream);
    let mut pending_gone = 0i64;
    let mut pending_held = 0i64;
    for (id, held) in pending_ids.iter().zip(&held) {
        if *held {
            pending_held += 1;
        } else if parse_stream_id(id).is_some_and(|i| empty || first.is_some_and(|f| i < f)) {
            pending_gone += 1;
        }
    }
    Ok(Some(Measure {
        pending_held: complete.then_some(pending_held),
        pending_gone,
        unread,
        added: snap.int("entries-added"),
        read,
        max_deleted: snap
            .id("max-deleted-entry-id")
            .filter(|d| *d != (0, 0))
            .map(|d| (d, snap.text("max-deleted-entry-id").unwrap_or_default())),
        count_raced,
        accounted,
        group: snap.group,
    }))
}

/// What a measurement says about entries lost before export, and whether that is final
/// (`false`: the exporter stored entries meanwhile and the bounds do not agree; measure
/// again).
fn judge(m: &Measure, s: &str, group: &str, replica: bool) -> (Trim, bool) {
    let missing = m.missing();
    // Redis cannot count: the database alone decides.
    let from_db = |why: String| match missing {
        Some((_, hi)) if hi <= 0 => (Trim::None, true),
        Some((lo, hi)) => (Trim::Unknown(why, Some((lo.max(0), hi))), lo == hi),
        None => (Trim::Unknown(why, None), true),
    };
    let (trim, final_) = if m.count_raced {
        (
            Trim::Unknown(
                "the stream was trimmed while reconcile counted a backlog of more than 10000 \
                 entries: run reconcile again once the exporter has caught up"
                    .to_string(),
                None,
            ),
            false,
        )
    } else if m.max_deleted.as_ref().is_some_and(|(d, _)| *d > m.read) {
        // XDEL after the group's position: an entry deleted before the group read it, unless
        // the database holds every entry (a group set back before the XDEL).
        match missing {
            Some((_, hi)) if hi <= 0 => (Trim::None, true),
            _ => (Trim::Lost(None), true),
        }
    } else if let Some((_, text)) = &m.max_deleted {
        from_db(format!(
            "entries were deleted from {s} with XDEL (max-deleted-entry-id {text}): Redis then \
             estimates group {group:?}'s read counter, which can hide entries trimmed unread"
        ))
    } else {
        match (m.added, m.group.entries_read) {
            (Some(a), Some(r)) => {
                let counted = a.saturating_sub(r).saturating_sub(m.unread);
                // A re-created group (or one set back) reads again what the database holds:
                // the loss is at most what the database lacks.
                match missing {
                    _ if counted <= 0 => (Trim::None, true),
                    None => (Trim::Lost(Some(counted)), true),
                    Some((lo, hi)) => {
                        let low = counted.min(lo.max(0));
                        let high = counted.min(hi);
                        if high <= 0 {
                            (Trim::None, true)
                        } else if low == high {
                            (Trim::Lost(Some(low)), true)
                        } else if low > 0 {
                            (Trim::Lost(Some(low)), false)
                        } else {
                            (
                                Trim::Unknown(
                                    format!(
                                        "Redis counts {counted} entries of {s} trimmed before \
                                         group {group:?} read them, and the exporter stored \
                                         entries while reconcile compared with the database"
                                    ),
                                    Some((0, high)),
                                ),
                                false,
                            )
                        }
                    }
                }
            }
            _ if replica => from_db(format!(
                "XINFO GROUPS gives no entries-read for group {group:?}: this server is a \
                 replica, and Redis 7.0 replicas do not keep it; run reconcile against the master"
            )),
            _ => from_db(format!(
                "XINFO GROUPS gives no entries-read for group {group:?} (Redis cannot count its \
                 reads, e.g. after XGROUP SETID without ENTRIESREAD)"
            )),
        }
    };
    // A replica's copy of the group's counters can lag its master's (a resync, a read not
    // replicated yet): a loss seen there is not certain.
    match trim {
        Trim::Lost(n) if replica => (
            Trim::Unknown(
                format!(
                    "this server is a replica: its copy of group {group:?}'s counters can lag \
                     the master's, so the loss they suggest is not certain; run reconcile \
                     against the master"
                ),
                n.map(|n| (n, n))
                    .or(missing.map(|(lo, hi)| (lo.max(0), hi))),
            ),
            final_,
        ),
        t => (t, final_),
    }
}

fn check_stream(
    con: &mut redis::Connection,
    db: &mut Db,
    s: &str,
    group: &str,
    replica: bool,
) -> Result<StreamState, Error> {
    const ATTEMPTS: usize = 10;
    let kind: String = redis::cmd("TYPE").arg(s).query(con)?;
    match kind.as_str() {
        "none" => return Ok(StreamState::Missing),
        "stream" => {}
        other => return Ok(StreamState::WrongType(other.to_string())),
    }
    let groups: Value = redis::cmd("XINFO").arg("GROUPS").arg(s).query(con)?;
    let Some(g) = group_info(&groups, group) else {
        return Ok(StreamState::NoGroup);
    };
    let mut after = g.last_delivered;
    let mut attempt = 0;
    loop {
        let Some(m) = measure(con, db, s, group, &after)? else {
            return Ok(StreamState::NoGroup);
        };
        attempt += 1;
        let (trim, final_) = judge(&m, s, group, replica);
        // Measuring again helps only while the exporter stores a small backlog.
        let backlog = m.unread.saturating_add(m.group.pending);
        if final_ || attempt >= ATTEMPTS || backlog >= i64::try_from(PAGE).unwrap_or(i64::MAX) {
            let pending_waiting = m.pending_waiting();
            return Ok(StreamState::Checked {
                trim,
                unread: m.unread,
                deleted_pending: db.deleted_while_pending(s)?.saturating_add(m.pending_gone),
                pending_waiting,
                group: m.group,
            });
        }
        // The exporter is storing entries: measure again in a moment.
        after = m.group.last_delivered;
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
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

/// `QUOTA.INFO key` as a [`Now`] and the budget's stream and period start; a key that holds
/// another type is [`Now::OtherType`], any other error names the key.
fn budget_now(con: &mut redis::Connection, key: &str) -> Result<(Now, Option<String>, i64), Error> {
    if key.contains('\u{FFFD}') {
        return Ok((Now::NotUtf8, None, -1));
    }
    let info: redis::RedisResult<Value> = redis::cmd("QUOTA.INFO").arg(key).query(con);
    let info = match info {
        Ok(v) => v,
        Err(e) if e.code() == Some("WRONGTYPE") => return Ok((Now::OtherType, None, -1)),
        Err(e) => return Err(format!("QUOTA.INFO {key}: {e}").into()),
    };
    let fields = pairs(&info);
    let text = |f: &str| {
        fields
            .iter()
            .find(|(k, _)| k == f)
            .and_then(|(_, v)| entry::text_of(v))
    };
    let int = |f: &str| text(f).and_then(|t| t.parse::<i64>().ok());
    let now = match int("used") {
        Some(u) => Now::Used(u),
        None => Now::Gone,
    };
    let stream = text("stream").filter(|s| !s.is_empty());
    Ok((now, stream, int("period_start_ms").unwrap_or(-1)))
}

/// Runs the check and prints the table; returns whether everything matched and nothing was
/// lost (see the module docs for the exact rule). `extra_streams` are checked too, even if
/// none of their entries reached the database.
pub fn reconcile(
    redis_url: &str,
    db_target: &str,
    group: &str,
    extra_streams: &[String],
    timeout: Timeout,
) -> Result<bool, Error> {
    let mut db = Db::open_existing(db_target, timeout)?;
    let mut con = connect(redis_url, timeout, timeout)?;
    let replica = is_replica(&mut con);
    if replica {
        out!(
            "note: {} is a replica: reconcile (like run) belongs on the master \
             (a replica's copy of the group's counters can lag or be missing)",
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
                now: Now::Gone,
                moving: false,
            }),
        }
    }
    let mut streams: Vec<String> = pairs_in_db.iter().map(|(_, s)| s.clone()).collect();
    for l in &mut lines {
        let (now, stream, period_start) = budget_now(&mut con, &l.key)?;
        if let Some(s) = stream {
            l.streams.push(s.clone());
            streams.push(s);
        }
        // A key that is no budget now: its latest period in the database.
        l.period_start = match now {
            Now::Used(_) => period_start,
            _ => db.latest_period(&l.key)?,
        };
        l.now = now;
        l.db_sum = db.charged(&l.key, l.period_start)?;
    }
    // A key read while gateways charge and an exporter stores may not match for a moment:
    // read the keys that do not match again, a few times.
    for _ in 0..10 {
        let unmatched: Vec<&mut Line> = lines
            .iter_mut()
            .filter(|l| matches!(l.now, Now::Used(u) if u != l.db_sum))
            .collect();
        if unmatched.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        for l in unmatched {
            let (now, _, period_start) = budget_now(&mut con, &l.key)?;
            if let Now::Used(u) = now {
                l.moving |= !matches!(l.now, Now::Used(before) if before == u)
                    || period_start != l.period_start;
                l.period_start = period_start;
                l.db_sum = db.charged(&l.key, period_start)?;
            }
            l.now = now;
        }
    }
    streams.extend(extra_streams.iter().cloned());
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
    out!(
        "{:<width$}  {:>14}  {:>14}  {:>14}  {:>10}  status",
        "key",
        "period_start",
        "db_charged",
        "used",
        "diff"
    );
    let mut compared = 0usize;
    let mut mismatched = 0usize;
    // Mismatched keys no stream state explains.
    let mut unexplained = 0usize;
    // Mismatched keys whose `used` kept changing while read.
    let mut moving = 0usize;
    let mut not_utf8 = 0usize;
    for l in &lines {
        let (used, diff, status) = match l.now {
            Now::Used(u) => {
                compared += 1;
                let status = if u == l.db_sum {
                    "ok".to_string()
                } else {
                    mismatched += 1;
                    // Say why when a stream of this key tells.
                    let why = l.streams.iter().find_map(|s| match state_of(s) {
                        Some(st) if st.lost() => {
                            Some(format!(" (entries of {s} lost before export)"))
                        }
                        Some(StreamState::Checked {
                            trim: Trim::Unknown(..),
                            ..
                        }) => Some(format!(" (loss check of {s} not possible, see below)")),
                        Some(StreamState::Checked {
                            unread,
                            pending_waiting,
                            ..
                        }) if *unread > 0 || *pending_waiting > 0 => {
                            Some(format!(" (entries of {s} not exported yet)"))
                        }
                        Some(StreamState::Missing) => Some(format!(" (stream {s} missing)")),
                        Some(StreamState::NoGroup) => Some(format!(" (no group {group:?} on {s})")),
                        Some(StreamState::WrongType(_)) => Some(format!(" ({s} is not a stream)")),
                        _ => None,
                    });
                    let why = why.or_else(|| {
                        l.moving.then(|| {
                            moving += 1;
                            " (still changing while reconcile read it: charges not exported yet)"
                                .to_string()
                        })
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
            Now::Gone => (
                "-".into(),
                "-".into(),
                "gone (no budget at this key)".into(),
            ),
            Now::OtherType => (
                "-".into(),
                "-".into(),
                "gone (the key holds another type now)".into(),
            ),
            Now::NotUtf8 => {
                not_utf8 += 1;
                (
                    "-".into(),
                    "-".into(),
                    "NOT CHECKED (the key's name is not UTF-8; the database holds it with U+FFFD)"
                        .into(),
                )
            }
        };
        out!(
            "{:<width$}  {:>14}  {:>14}  {:>14}  {:>10}  {status}",
            l.key,
            l.period_start,
            l.db_sum,
            used,
            diff
        );
    }

    let mut waiting = 0i64;
    let mut lost = false;
    let mut no_group = 0usize;
    let mut wrong_type = 0usize;
    let mut unchecked = false;
    let mut possibly_lost = false;
    for (s, st) in &states {
        match st {
            StreamState::Missing => out!(
                "stream {s}: missing in Redis (deleted, or --redis names another server or \
                 database number)"
            ),
            StreamState::WrongType(t) => {
                out!("stream {s}: the key holds a {t}, not a stream");
                wrong_type += 1;
            }
            StreamState::NoGroup => {
                out!(
                    "stream {s}: no consumer group {group:?}: nothing of it was exported by that group"
                );
                no_group += 1;
            }
            StreamState::Checked {
                group: g,
                trim,
                unread,
                deleted_pending,
                pending_waiting,
            } => {
                match trim {
                    Trim::None => {}
                    Trim::Lost(n) => {
                        out!(
                            "stream {s}: TRIMMED PAST THE GROUP: {} entries were deleted \
                             (STREAMMAXLEN, XTRIM, XDEL) before group {group:?} had read them \
                             (it has read up to {}): those entries were lost before export, \
                             and the database cannot match Redis; exporting again cannot bring \
                             them back",
                            n.map_or_else(|| "some".to_string(), |n| n.to_string()),
                            g.last_delivered
                        );
                        lost = true;
                    }
                    Trim::Unknown(why, missing) => {
                        match missing {
                            Some((lo, hi)) => {
                                let m = if lo == hi {
                                    lo.to_string()
                                } else {
                                    format!("up to {hi}")
                                };
                                out!(
                                    "stream {s}: loss check not possible: {why}; and the \
                                     database lacks {m} of the entries the stream received (lost \
                                     before export, rows deleted from the database, or stored in \
                                     another database)"
                                );
                                possibly_lost = true;
                            }
                            None => out!("stream {s}: loss check not possible: {why}"),
                        }
                        unchecked = true;
                    }
                }
                if *deleted_pending > 0 {
                    out!(
                        "stream {s}: DELETED WHILE PENDING: {deleted_pending} entries were read \
                         by group {group:?} but deleted from the stream (STREAMMAXLEN, XTRIM, XDEL) \
                         before they were stored (recorded in quota_usage_rejects, or still \
                         pending below the stream's first entry): lost before export"
                    );
                    lost = true;
                }
                if *unread != 0 || *pending_waiting != 0 {
                    waiting = waiting
                        .saturating_add(*unread)
                        .saturating_add(*pending_waiting);
                    out!(
                        "stream {s}: not yet exported: {unread} unread, {pending_waiting} \
                         pending (run `quota-export run --once` first; entries pending at \
                         another consumer are taken over after its --claim-idle-ms)"
                    );
                }
            }
        }
    }
    let (rows, malformed, deleted) = db.counts()?;
    out!(
        "database: {rows} usage rows, {malformed} malformed entries skipped, {deleted} entries \
         deleted while pending"
    );

    let mut reasons: Vec<String> = Vec::new();
    if rows == 0 {
        reasons.push(
            "nothing to compare: the database has no usage rows (has `quota-export run` \
             stored anything yet? is --db the database it writes to?)"
                .into(),
        );
    } else if compared == 0 {
        reasons.push(format!(
            "nothing to compare: none of the database's {} budget keys exists in this Redis; \
             is --redis the right server and database number?",
            lines.len()
        ));
    }
    if mismatched > 0 {
        reasons.push(format!("{mismatched} budget key(s) do not match"));
    }
    if lost {
        reasons.push(
            "entries were deleted from the stream (trimmed or XDEL) before export: lost, the \
             database cannot match Redis"
                .into(),
        );
    }
    if possibly_lost {
        reasons.push(
            "the database lacks entries the stream received, and Redis cannot tell whether \
             they were lost before export, see above"
                .into(),
        );
    } else if unchecked && mismatched > 0 {
        reasons
            .push("whether entries were lost before export could not be checked, see above".into());
    }
    if waiting > 0 && (mismatched > 0 || lost || possibly_lost) {
        reasons.push(if lost {
            "some entries are also not exported yet".into()
        } else {
            "some entries are not exported yet".into()
        });
    }
    if moving > 0 {
        reasons.push(format!(
            "{moving} budget key(s) kept changing while reconcile read them (charges coming \
             in faster than they are exported): run reconcile again, or when traffic pauses"
        ));
    }
    if no_group > 0 {
        reasons.push(format!(
            "no consumer group {group:?} on {no_group} stream(s): is --group the group \
             `quota-export run` uses, and are those streams among its --stream keys?"
        ));
    }
    if wrong_type > 0 {
        reasons.push(format!("{wrong_type} stream key(s) hold another type"));
    }
    if unexplained > 0 {
        reasons.push(format!(
            "for {unexplained} of them nothing seen explains it: charged before their STREAM \
             was set, a period rule changed back (docs/usage-export.md), the stream deleted and \
             re-created, a loss acknowledged with XGROUP SETID, rows written to another \
             database, or charges and the exporter moving while reconcile read (run it again)?"
        ));
    }
    if !reasons.is_empty() {
        out!("reconcile: FAILED ({})", reasons.join("; "));
        return Ok(false);
    }
    let mut notes: Vec<String> = Vec::new();
    if waiting > 0 {
        notes.push(format!("{waiting} entries are not exported yet, see above"));
    }
    if unchecked {
        notes
            .push("whether entries were lost before export could not be checked, see above".into());
    }
    if not_utf8 > 0 {
        notes.push(format!(
            "{not_utf8} key(s) not checked: their names are not UTF-8"
        ));
    }
    if notes.is_empty() {
        out!("reconcile: OK");
    } else {
        out!("reconcile: OK (every budget matches; {})", notes.join("; "));
    }
    Ok(true)
}
