//! `quota-export run`: consume usage streams with a consumer group and store each entry once.
//!
//! Order of work, so that a crash at any point loses nothing and counts nothing twice:
//! 1. `XGROUP CREATE stream group 0 MKSTREAM ENTRIESREAD 0` (an existing group is kept):
//!    with a valid read counter from the start, Redis' `entries-read` counts exactly the
//!    entries the group read, so entries trimmed before its first read show as lag for good
//!    (without `ENTRIESREAD`, Redis estimates the counter at the first read and hides them);
//! 2. this consumer's own pending entries first (`XREADGROUP ... STREAMS s 0`): what it had
//!    read before a crash but not acknowledged;
//! 3. then in a loop: `XAUTOCLAIM` of entries another consumer left pending for longer than
//!    `--claim-idle-ms` (a dead exporter), and new entries (`XREADGROUP ... >`);
//! 4. each batch: one database transaction (`ON CONFLICT DO NOTHING`), commit, then `XACK`.
//!
//! A malformed entry is stored in `quota_usage_rejects`, logged, counted and acknowledged:
//! it never stops the exporter. So is an entry deleted while pending (reason
//! [`DELETED_WHILE_PENDING`]), for `reconcile` to count as lost.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use redis::Value;

use crate::db::{redact, scrub, Db, Timeout, DELETED_WHILE_PENDING};
use crate::entry::{self, Malformed, RawEntry, Row};
use crate::metrics::Shared;
use crate::Error;

/// What `run` needs.
pub struct RunOptions {
    pub redis: String,
    pub db: String,
    pub streams: Vec<String>,
    pub group: String,
    pub consumer: String,
    pub once: bool,
    pub batch: usize,
    pub block_ms: u64,
    pub claim_idle_ms: u64,
    /// Connecting, and a reply beyond the blocking read's own wait, may take this long.
    pub timeout: Timeout,
}

struct Consumer {
    con: redis::Connection,
    db: Db,
    opts: RunOptions,
    metrics: Shared,
    progress: ProgressBar,
    exported: u64,
    started: Instant,
}

/// Runs until killed, or with `--once` until every stream is caught up.
pub fn run(opts: RunOptions, metrics: Shared) -> Result<(), Error> {
    let read_timeout = opts
        .timeout
        .saturating_add(Duration::from_millis(opts.block_ms));
    let con = connect(&opts.redis, opts.timeout, read_timeout)?;
    let db = Db::open(&opts.db, opts.timeout)?;
    let progress = ProgressBar::new_spinner();
    progress.set_style(
        ProgressStyle::with_template("{spinner} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    let mut c = Consumer {
        con,
        db,
        opts,
        metrics,
        progress,
        exported: 0,
        started: Instant::now(),
    };
    c.create_groups()?;
    c.own_pending()?;
    let mut last_claim = None::<Instant>;
    let mut last_lag = None::<Instant>;
    // A stop and continue (SIGSTOP/SIGCONT, Ctrl-Z and fg, a paused container) interrupts a
    // blocked read, maybe half way through a reply: connect again. What was delivered and not
    // stored stays pending and is taken back. Interrupted again meanwhile: again.
    let mut interrupted = 0u32;
    let mut reconnect = false;
    loop {
        let recovered = if reconnect {
            connect(&c.opts.redis, c.opts.timeout, read_timeout).and_then(|con| {
                c.con = con;
                c.own_pending()
            })
        } else {
            Ok(())
        };
        let step = recovered.and_then(|()| {
            reconnect = false;
            c.step(&mut last_claim, &mut last_lag)
        });
        let work = match step {
            Ok(work) => {
                interrupted = 0;
                work
            }
            Err(e) if is_interrupted(&e) && interrupted < 100 => {
                interrupted += 1;
                note!("quota-export: interrupted ({e}): connecting again");
                reconnect = true;
                continue;
            }
            Err(e) => return Err(e),
        };
        if c.opts.once && work == 0 {
            c.update_lag()?;
            c.progress.finish_and_clear();
            note!(
                "quota-export: caught up: {} entries exported by this run",
                c.exported
            );
            let pending: i64 = c
                .metrics
                .lock()
                .map(|m| m.pending.values().sum())
                .unwrap_or(0);
            if pending > 0 {
                note!(
                    "quota-export: note: {pending} entries are still pending at other consumers \
                     of group {:?}: they are taken over once idle for --claim-idle-ms ({} ms); \
                     run again then (or with a lower --claim-idle-ms if those consumers are dead)",
                    c.opts.group,
                    c.opts.claim_idle_ms
                );
            }
            return Ok(());
        }
    }
}

/// Is `e` an interrupted system call (`EINTR`)?
fn is_interrupted(e: &Error) -> bool {
    let text = e.to_string();
    text.contains("os error 4)") || text.contains("Interrupted system call")
}

impl Consumer {
    /// One round: claims (when due), new entries, the lag (when due); the entries taken.
    fn step(
        &mut self,
        last_claim: &mut Option<Instant>,
        last_lag: &mut Option<Instant>,
    ) -> Result<usize, Error> {
        let mut work = 0;
        let claim_every = Duration::from_millis(self.opts.claim_idle_ms.clamp(100, 10_000));
        if self.opts.once || last_claim.is_none_or(|t| t.elapsed() >= claim_every) {
            work += self.autoclaim()?;
            *last_claim = Some(Instant::now());
        }
        work += self.read_new()?;
        if last_lag.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            self.update_lag()?;
            *last_lag = Some(Instant::now());
        }
        Ok(work)
    }

    fn create_groups(&mut self) -> Result<(), Error> {
        for s in &self.opts.streams {
            let existed: bool = redis::cmd("EXISTS")
                .arg(s)
                .query(&mut self.con)
                .map_err(|e| stream_error(s, &e))?;
            let r: redis::RedisResult<Value> = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(s)
                .arg(&self.opts.group)
                .arg("0")
                .arg("MKSTREAM")
                .arg("ENTRIESREAD")
                .arg(0)
                .query(&mut self.con);
            match r {
                Ok(_) if !existed => note!(
                    "quota-export: warning: stream {s} did not exist in {}: created it empty, \
                     with group {:?}. If no budget logs to it yet that is fine; otherwise check \
                     --stream and the database number in --redis (QUOTA.INFO <budget key> shows \
                     the budget's stream)",
                    redact(&self.opts.redis),
                    self.opts.group
                ),
                Ok(_) => {}
                Err(e) if e.code() == Some("BUSYGROUP") => {}
                Err(e) => return Err(stream_error(s, &e).into()),
            }
        }
        Ok(())
    }

    /// Takes back this consumer's own pending entries (read before a restart, never acked).
    fn own_pending(&mut self) -> Result<(), Error> {
        for s in self.opts.streams.clone() {
            let mut cursor = "0".to_string();
            loop {
                let reply: Value = redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg(&self.opts.group)
                    .arg(&self.opts.consumer)
                    .arg("COUNT")
                    .arg(self.opts.batch)
                    .arg("STREAMS")
                    .arg(&s)
                    .arg(&cursor)
                    .query(&mut self.con)
                    .map_err(|e| stream_error(&s, &e))?;
                let batches = streams_of(&reply);
                let Some((_, entries)) = batches.into_iter().next() else {
                    break;
                };
                let Some(last) = entries.last() else {
                    break;
                };
                cursor = last.id.clone();
                self.process(&s, entries)?;
            }
        }
        Ok(())
    }

    /// XAUTOCLAIM of entries idle longer than `--claim-idle-ms` in every stream; returns how
    /// many entries it took.
    fn autoclaim(&mut self) -> Result<usize, Error> {
        let mut total = 0;
        for s in self.opts.streams.clone() {
            let mut start = "0-0".to_string();
            loop {
                let reply: Value = redis::cmd("XAUTOCLAIM")
                    .arg(&s)
                    .arg(&self.opts.group)
                    .arg(&self.opts.consumer)
                    .arg(self.opts.claim_idle_ms)
                    .arg(&start)
                    .arg("COUNT")
                    .arg(self.opts.batch)
                    .query(&mut self.con)
                    .map_err(|e| stream_error(&s, &e))?;
                let Value::Array(parts) = &reply else {
                    break;
                };
                let next = parts
                    .first()
                    .and_then(entry::text_of)
                    .unwrap_or_else(|| "0-0".into());
                let (entries, bad) = parts.get(1).map(entry::parse_entries).unwrap_or_default();
                for b in bad {
                    note!("quota-export: {s}: odd XAUTOCLAIM reply element skipped: {b}");
                }
                // Entries deleted while pending (trimmed): Redis drops them from the PEL.
                if let Some(Value::Array(deleted)) = parts.get(2) {
                    if !deleted.is_empty() {
                        let ids: Vec<Malformed> = deleted
                            .iter()
                            .filter_map(entry::text_of)
                            .map(|id| deleted_entry(&s, id))
                            .collect();
                        let (_, recorded) = self
                            .db
                            .store(&[], &ids)
                            .map_err(|e| db_error(&self.opts.db, &e))?;
                        if recorded > 0 {
                            note!(
                                "quota-export: {s}: {recorded} pending entries were deleted \
                                 (trimmed or XDEL) before export"
                            );
                            self.lost(&s, recorded);
                        }
                    }
                }
                total += entries.len();
                self.process(&s, entries)?;
                if next == "0-0" {
                    break;
                }
                start = next;
            }
        }
        Ok(total)
    }

    /// New entries of every stream (`>`); blocks up to `--block-ms` unless `--once`.
    fn read_new(&mut self) -> Result<usize, Error> {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.opts.group)
            .arg(&self.opts.consumer)
            .arg("COUNT")
            .arg(self.opts.batch);
        if !self.opts.once {
            cmd.arg("BLOCK").arg(self.opts.block_ms);
        }
        cmd.arg("STREAMS");
        for s in &self.opts.streams {
            cmd.arg(s);
        }
        for _ in &self.opts.streams {
            cmd.arg(">");
        }
        let reply: Value = cmd
            .query(&mut self.con)
            .map_err(|e| stream_error(&self.opts.streams.join(", "), &e))?;
        let mut total = 0;
        for (s, entries) in streams_of(&reply) {
            total += entries.len();
            self.process(&s, entries)?;
        }
        Ok(total)
    }

    /// Stores a batch of one stream's entries, then acknowledges them.
    fn process(&mut self, stream: &str, entries: Vec<RawEntry>) -> Result<(), Error> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut rows: Vec<Row> = Vec::with_capacity(entries.len());
        let mut rejects: Vec<Malformed> = Vec::new();
        let mut gone = 0;
        for e in &entries {
            match &e.fields {
                None => {
                    gone += 1;
                    rejects.push(deleted_entry(stream, e.id.clone()));
                }
                Some(fields) => match entry::parse_row(stream, &e.id, fields) {
                    Ok(r) => rows.push(r),
                    Err(m) => {
                        note!(
                            "quota-export: {stream} {}: malformed entry skipped: {}",
                            m.entry_id,
                            m.reason
                        );
                        rejects.push(m);
                    }
                },
            }
        }
        let (inserted, lost) = self
            .db
            .store(&rows, &rejects)
            .map_err(|e| db_error(&self.opts.db, &e))?;
        // Acknowledged only after the commit: a crash before this line redelivers the batch,
        // and ON CONFLICT DO NOTHING keeps it from counting twice.
        let mut ack = redis::cmd("XACK");
        ack.arg(stream).arg(&self.opts.group);
        for e in &entries {
            ack.arg(&e.id);
        }
        let _: Value = ack
            .query(&mut self.con)
            .map_err(|e| stream_error(stream, &e))?;
        self.exported += inserted.len() as u64;
        if let Ok(mut m) = self.metrics.lock() {
            m.stored(&inserted);
            let malformed = rejects.len().saturating_sub(gone);
            if malformed > 0 {
                *m.malformed.entry(stream.to_string()).or_default() += malformed as u64;
            }
        }
        if lost > 0 {
            note!("quota-export: {stream}: {lost} pending entries were deleted (trimmed or XDEL) before export");
            self.lost(stream, lost);
        }
        self.show();
        Ok(())
    }

    fn lost(&mut self, stream: &str, n: usize) {
        if let Ok(mut m) = self.metrics.lock() {
            *m.lost.entry(stream.to_string()).or_default() += n as u64;
        }
    }

    /// Lag and pending count of the group in every stream (`XINFO GROUPS`).
    fn update_lag(&mut self) -> Result<(), Error> {
        for s in self.opts.streams.clone() {
            let reply: Value = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(&s)
                .query(&mut self.con)
                .map_err(|e| stream_error(&s, &e))?;
            if let Some(g) = group_info(&reply, &self.opts.group) {
                if let Ok(mut m) = self.metrics.lock() {
                    let k = (s.clone(), self.opts.group.clone());
                    m.lag.insert(k.clone(), g.lag.unwrap_or(-1));
                    m.pending.insert(k, g.pending);
                }
            }
        }
        self.show();
        Ok(())
    }

    fn show(&self) {
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let lag: i64 = self
            .metrics
            .lock()
            .map(|m| m.lag.values().filter(|v| **v > 0).sum())
            .unwrap_or(0);
        self.progress.set_message(format!(
            "{} entries exported ({:.0}/s), lag {lag}",
            self.exported,
            self.exported as f64 / secs
        ));
        self.progress.tick();
    }
}

/// `(stream, entries)` of an XREADGROUP reply (RESP2 array of `[name, entries]`, or a map).
fn streams_of(reply: &Value) -> Vec<(String, Vec<RawEntry>)> {
    let mut out = Vec::new();
    let mut one = |name: &Value, entries: &Value| {
        if let Some(n) = entry::text_of(name) {
            let (e, bad) = entry::parse_entries(entries);
            for b in bad {
                note!("quota-export: {n}: odd reply element skipped: {b}");
            }
            out.push((n, e));
        }
    };
    match reply {
        Value::Array(items) => {
            for item in items {
                if let Value::Array(pair) = item {
                    if let (Some(n), Some(e)) = (pair.first(), pair.get(1)) {
                        one(n, e);
                    }
                }
            }
        }
        Value::Map(kv) => {
            for (n, e) in kv {
                one(n, e);
            }
        }
        _ => {}
    }
    out
}

/// One consumer group as `XINFO GROUPS` describes it.
#[derive(Debug, Default)]
pub struct GroupInfo {
    pub last_delivered: String,
    pub pending: i64,
    /// `None`: Redis cannot tell (entries were deleted after the group's position).
    pub lag: Option<i64>,
    /// Entries the group has read since the stream began (`None`: unknown).
    pub entries_read: Option<i64>,
}

/// The reject row recording that entry `id` of `stream` was deleted while pending.
fn deleted_entry(stream: &str, id: String) -> Malformed {
    Malformed {
        stream: stream.to_string(),
        entry_id: id,
        reason: DELETED_WHILE_PENDING.to_string(),
    }
}

/// A connection to `url`, given `timeout` to connect and `read_timeout` for each reply; an
/// error names the (password-redacted) URL.
pub fn connect(
    url: &str,
    timeout: Timeout,
    read_timeout: Timeout,
) -> Result<redis::Connection, Error> {
    let con = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(timeout))
        .and_then(|c| {
            c.set_read_timeout(Some(read_timeout))?;
            c.set_write_timeout(Some(timeout))?;
            Ok(c)
        });
    con.map_err(|e| {
        let why = if e.is_timeout() {
            format!("no answer within {} ms (--timeout-ms)", timeout.as_millis())
        } else {
            e.to_string()
        };
        scrub(&format!("redis {}: {why}", redact(url)), url).into()
    })
}

/// A database error, naming the target (password hidden).
pub fn db_error(target: &str, e: &Error) -> String {
    let shown = redact(target);
    let text = e.to_string();
    if text.starts_with("database ") {
        text
    } else {
        format!("database {shown}: {text}")
    }
}

/// A Redis error about one stream, readable: names the stream and, for `WRONGTYPE`, says
/// that the key holds something else.
pub fn stream_error(stream: &str, e: &redis::RedisError) -> String {
    let detail = e.detail().unwrap_or_default();
    match e.code() {
        Some("WRONGTYPE") => format!(
            "stream {stream}: the key holds another type, not a stream (WRONGTYPE {detail}); \
             check --stream"
        ),
        Some("READONLY") => format!(
            "stream {stream}: READONLY {detail} (this server is a replica: run the exporter \
             against the master)"
        ),
        Some(code) => format!("stream {stream}: {code} {detail}"),
        None => format!("stream {stream}: {e}"),
    }
}

/// Field/value pairs of a flat RESP2 array or a RESP3 map.
pub fn pairs(v: &Value) -> Vec<(String, &Value)> {
    match v {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|c| Some((entry::text_of(c.first()?)?, c.get(1)?)))
            .collect(),
        Value::Map(kv) => kv
            .iter()
            .filter_map(|(k, v)| Some((entry::text_of(k)?, v)))
            .collect(),
        _ => Vec::new(),
    }
}

/// The group `name` in an `XINFO GROUPS` reply.
pub fn group_info(reply: &Value, name: &str) -> Option<GroupInfo> {
    let Value::Array(groups) = reply else {
        return None;
    };
    groups.iter().find_map(|g| {
        let p = pairs(g);
        let get = |f: &str| p.iter().find(|(k, _)| k == f).map(|(_, v)| *v);
        (get("name").and_then(entry::text_of)? == name).then(|| GroupInfo {
            last_delivered: get("last-delivered-id")
                .and_then(entry::text_of)
                .unwrap_or_default(),
            pending: match get("pending") {
                Some(Value::Int(n)) => *n,
                _ => 0,
            },
            lag: match get("lag") {
                Some(Value::Int(n)) => Some(*n),
                _ => None,
            },
            entries_read: match get("entries-read") {
                Some(Value::Int(n)) => Some(*n),
                _ => None,
            },
        })
    })
}
