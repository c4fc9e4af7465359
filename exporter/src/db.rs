//! The database side: SQLite (a file path, the default) or PostgreSQL (`postgres://...`).
//!
//! Two tables, created if missing:
//! - `quota_usage`: one row per usage entry, primary key `(stream, entry_id)`;
//! - `quota_usage_rejects`: one row per malformed entry skipped, with the reason.
//!
//! A batch is stored in one transaction with `INSERT ... ON CONFLICT DO NOTHING`: an entry
//! delivered again after a crash between the commit and the XACK is not counted twice.

use crate::entry::{Malformed, Row};
use crate::Error;

/// The `reason` of a `quota_usage_rejects` row for an entry deleted from the stream (trimmed,
/// `XDEL`) while it was pending: read by the group, never stored. Reconcile counts these as
/// lost before export.
pub const DELETED_WHILE_PENDING: &str =
    "deleted from the stream while pending (trimmed or XDEL): lost before export";

/// `url` with its password replaced by `***`, for messages: the userinfo's
/// (`scheme://user:***@host/...`, also without the scheme) and any query parameter whose name
/// holds `pass` (`?password=***`, `?pass=***`).
pub fn redact(url: &str) -> String {
    let parts = UrlParts::of(url);
    let authority = match parts.userinfo {
        Some(userinfo) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            if userinfo.contains(':') || user.is_empty() {
                format!("{user}:***@{}", parts.host)
            } else {
                format!("{user}@{}", parts.host)
            }
        }
        None => parts.host.to_string(),
    };
    let (path, query) = match parts.after.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (parts.after, None),
    };
    let query = query.map(|q| {
        let params: Vec<String> = q
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _)) if k.to_ascii_lowercase().contains("pass") => format!("{k}=***"),
                _ => kv.to_string(),
            })
            .collect();
        format!("?{}", params.join("&"))
    });
    format!(
        "{}{authority}{path}{}",
        parts.scheme,
        query.unwrap_or_default()
    )
}

/// A URL cut where its password can be: `scheme://`, the userinfo (before the *last* `@`, so a
/// password may hold `/`, `?` or `#`), the host, and what follows (path, query).
struct UrlParts<'a> {
    scheme: &'a str,
    userinfo: Option<&'a str>,
    host: &'a str,
    after: &'a str,
}

impl<'a> UrlParts<'a> {
    fn of(url: &'a str) -> UrlParts<'a> {
        let (scheme, rest) = match url.find("://") {
            Some(i) => url.split_at(i.saturating_add(3)),
            None => ("", url),
        };
        let (userinfo, hosted) = match rest.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, rest),
        };
        let host_end = hosted.find(['/', '?', '#']).unwrap_or(hosted.len());
        let (host, after) = hosted.split_at(host_end);
        UrlParts {
            scheme,
            userinfo,
            host,
            after,
        }
    }
}

/// How long connecting to a database or to Redis, and one reply, may take before the command
/// gives up with an error (`--timeout-ms`).
pub type Timeout = std::time::Duration;

/// `e` and its sources, `a: b: c` (a PostgreSQL "error connecting to server" says why only in
/// its source).
pub fn with_sources(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = s.source();
    }
    text
}

/// A SQLite path's problem before opening it: a directory is not a database.
fn check_sqlite_path(path: &str) -> Result<(), Error> {
    if std::path::Path::new(path).is_dir() {
        return Err(format!("database {path}: is a directory, not a SQLite file").into());
    }
    Ok(())
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS quota_usage (
    stream       TEXT   NOT NULL,
    entry_id     TEXT   NOT NULL,
    budget_key   TEXT   NOT NULL,
    event        TEXT   NOT NULL,
    id           TEXT   NOT NULL,
    held         BIGINT NOT NULL,
    charged      BIGINT NOT NULL,
    used         BIGINT NOT NULL,
    period_start BIGINT NOT NULL,
    at_ms        BIGINT NOT NULL,
    PRIMARY KEY (stream, entry_id)
);
CREATE INDEX IF NOT EXISTS quota_usage_by_key ON quota_usage (budget_key, period_start);
CREATE TABLE IF NOT EXISTS quota_usage_rejects (
    stream   TEXT NOT NULL,
    entry_id TEXT NOT NULL,
    reason   TEXT NOT NULL,
    PRIMARY KEY (stream, entry_id)
);
";

const INSERT_ROW: &str = "INSERT INTO quota_usage
    (stream, entry_id, budget_key, event, id, held, charged, used, period_start, at_ms)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
    ON CONFLICT (stream, entry_id) DO NOTHING";

const INSERT_REJECT: &str = "INSERT INTO quota_usage_rejects (stream, entry_id, reason)
    VALUES ($1, $2, $3) ON CONFLICT (stream, entry_id) DO NOTHING";

/// An entry deleted while pending is recorded only when it was not stored: a run that
/// committed it but died before its XACK leaves it pending, and it may be trimmed after.
const INSERT_DELETED: &str = "INSERT INTO quota_usage_rejects (stream, entry_id, reason)
    SELECT CAST($1 AS TEXT), CAST($2 AS TEXT), CAST($3 AS TEXT)
    WHERE NOT EXISTS (SELECT 1 FROM quota_usage WHERE stream = $1 AND entry_id = $2)
    ON CONFLICT (stream, entry_id) DO NOTHING";

/// An open database.
pub enum Db {
    Sqlite(rusqlite::Connection),
    Postgres(Box<postgres::Client>),
}

/// Is `target` a PostgreSQL URL (else a SQLite file path)? The scheme in any case.
pub fn is_postgres(target: &str) -> bool {
    let lower = target.get(..13).unwrap_or(target).to_ascii_lowercase();
    lower.starts_with("postgres://") || lower.starts_with("postgresql://")
}

/// A target that is neither a PostgreSQL URL nor a file path: another URL scheme, or a libpq
/// key=value connection string (which would otherwise become a file of that name).
fn check_target(target: &str) -> Result<(), Error> {
    if is_postgres(target) {
        return Ok(());
    }
    if let Some((scheme, _)) = target.split_once("://") {
        if !scheme.eq_ignore_ascii_case("sqlite") {
            return Err(format!(
                "database {}: unsupported scheme {scheme:?}: give a SQLite file path \
                 (or sqlite://path) or a postgres:// URL",
                redact(target)
            )
            .into());
        }
    }
    let lower = target.to_ascii_lowercase();
    if ["postgres:", "postgresql:", "sqlite:"]
        .iter()
        .any(|p| lower.starts_with(p) && !lower.starts_with(&format!("{p}//")))
    {
        return Err(
            "database: a URL's scheme is followed by // (postgres://user:password@host:port/db, \
                    sqlite://path)"
                .into(),
        );
    }
    // An '@' in a path is a URL's user:password@host given without (or with a mangled)
    // scheme: refused, and not printed (it may hold a password).
    if target.contains('@') {
        return Err(
            "database: this looks like a URL (user:password@host) without its \
                    postgres:// scheme: give postgres://... or a file path without '@'"
                .into(),
        );
    }
    let path = sqlite_path(target).to_ascii_lowercase();
    if path.is_empty()
        || path.contains(":memory:")
        || path.starts_with("file:")
        || path.contains("mode=memory")
    {
        return Err(format!(
            "database {}: not a SQLite file (an in-memory or URI database would lose the \
             entries it acknowledges): give a file path",
            redact(target)
        )
        .into());
    }
    let conninfo = ["host=", "dbname=", "user=", "password=", "port="];
    if target.split_whitespace().any(|w| {
        conninfo
            .iter()
            .any(|k| w.to_ascii_lowercase().starts_with(k))
    }) {
        return Err(
            "database: this looks like a libpq connection string (key=value): give a \
                    postgres://user:password@host:port/db URL instead"
                .into(),
        );
    }
    Ok(())
}

/// The count of entries of a stream with an id up to `(ms, seq)` (included) the database
/// accounts for (rows stored, malformed entries skipped, entries recorded as deleted while
/// pending), in a dialect: how it takes an id's ms and seq apart, and its
/// parameters (stream, ms, seq).
fn accounted_query(ms: &str, seq: &str, [stream, p_ms, p_seq]: [&str; 3]) -> String {
    let upto =
        format!("stream = {stream} AND ({ms} < {p_ms} OR ({ms} = {p_ms} AND {seq} <= {p_seq}))");
    format!(
        "SELECT (SELECT COUNT(*) FROM quota_usage WHERE {upto}) \
         + (SELECT COUNT(*) FROM quota_usage_rejects WHERE {upto})"
    )
}

/// The SQLite file of `target`: without a `sqlite://` prefix (any case).
fn sqlite_path(target: &str) -> &str {
    match target.get(..9) {
        Some(p) if p.eq_ignore_ascii_case("sqlite://") => target.get(9..).unwrap_or_default(),
        _ => target,
    }
}

/// `text` with every password `url` holds (its userinfo's, and query parameters named like
/// `pass`) replaced by `***`: a driver's error may quote the URL.
pub fn scrub(text: &str, url: &str) -> String {
    let parts = UrlParts::of(url);
    let mut secrets: Vec<&str> = Vec::new();
    if let Some((_, pw)) = parts.userinfo.and_then(|u| u.split_once(':')) {
        secrets.push(pw);
    }
    let query = parts.after.split_once('?').map_or("", |(_, q)| q);
    for kv in query.split('&') {
        if let Some((k, v)) = kv.split_once('=') {
            if k.to_ascii_lowercase().contains("pass") {
                secrets.push(v);
            }
        }
    }
    let mut out = text.to_string();
    for pw in secrets.into_iter().filter(|p| !p.is_empty()) {
        out = out.replace(pw, "***");
    }
    out
}

/// Connects to PostgreSQL, giving up after `timeout` (connecting and the start-up exchange:
/// a server that accepts and never answers is an error, not a hang); errors name the URL,
/// password hidden.
fn connect_postgres(target: &str, timeout: Timeout) -> Result<postgres::Client, Error> {
    let shown = redact(target);
    let named =
        |e: postgres::Error| scrub(&format!("database {shown}: {}", with_sources(&e)), target);
    // The scheme in lower case: the driver knows only that spelling.
    let url = match target.split_once("://") {
        Some((scheme, rest)) => format!("{}://{rest}", scheme.to_ascii_lowercase()),
        None => target.to_string(),
    };
    let mut config: postgres::Config = url.parse().map_err(named)?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(timeout);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(config.connect(postgres::NoTls));
    });
    match rx.recv_timeout(timeout) {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(named(e).into()),
        Err(_) => Err(format!(
            "database {shown}: no answer within {} ms (--timeout-ms)",
            timeout.as_millis()
        )
        .into()),
    }
}

impl Db {
    /// Opens `target` (`postgres://...`/`postgresql://...`, else a SQLite path, optionally
    /// `sqlite://path`) and creates the tables if missing.
    pub fn open(target: &str, timeout: Timeout) -> Result<Db, Error> {
        check_target(target)?;
        if is_postgres(target) {
            let named =
                |e: postgres::Error| format!("database {}: {}", redact(target), with_sources(&e));
            let mut c = connect_postgres(target, timeout)?;
            c.batch_execute(SCHEMA).map_err(named)?;
            Ok(Db::Postgres(Box::new(c)))
        } else {
            let path = sqlite_path(target);
            check_sqlite_path(path)?;
            let named = |e: rusqlite::Error| format!("database {path}: {e}");
            let c = rusqlite::Connection::open(path).map_err(named)?;
            // Several exporters may share one file: wait for the lock instead of failing.
            c.busy_timeout(std::time::Duration::from_secs(60))
                .map_err(named)?;
            c.pragma_update(None, "journal_mode", "WAL")
                .map_err(named)?;
            c.execute_batch(SCHEMA).map_err(named)?;
            Ok(Db::Sqlite(c))
        }
    }

    /// Opens `target` for reading only what `quota-export run` wrote: the SQLite file must
    /// exist (it is never created) and the database must hold both tables (they are never
    /// created). Errors name the target and say what is missing: a mistyped path or URL must
    /// not look like an empty, matching database.
    pub fn open_existing(target: &str, timeout: Timeout) -> Result<Db, Error> {
        const MISSING: &str = "has no quota_usage/quota_usage_rejects tables: not a database \
            `quota-export run` wrote to (reconcile never creates them)";
        check_target(target)?;
        if is_postgres(target) {
            let shown = redact(target);
            let named = |e: postgres::Error| format!("database {shown}: {}", with_sources(&e));
            let mut c = connect_postgres(target, timeout)?;
            let found: bool = c
                .query_one(
                    "SELECT to_regclass('quota_usage') IS NOT NULL \
                     AND to_regclass('quota_usage_rejects') IS NOT NULL",
                    &[],
                )
                .map_err(named)?
                .get(0);
            if !found {
                return Err(format!("database {shown} {MISSING}").into());
            }
            Ok(Db::Postgres(Box::new(c)))
        } else {
            let path = sqlite_path(target);
            check_sqlite_path(path)?;
            if !std::path::Path::new(path).is_file() {
                return Err(format!(
                    "database {path}: no such file (reconcile opens an existing database only; \
                     `quota-export run` creates it)"
                )
                .into());
            }
            let named = |e: rusqlite::Error| format!("database {path}: {e}");
            let c = rusqlite::Connection::open_with_flags(
                path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE
                    | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(named)?;
            c.busy_timeout(std::time::Duration::from_secs(60))
                .map_err(named)?;
            let n: i64 = c
                .query_row(
                    "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' \
                     AND name IN ('quota_usage', 'quota_usage_rejects')",
                    [],
                    |r| r.get(0),
                )
                .map_err(named)?;
            if n != 2 {
                return Err(format!("database {path} {MISSING}").into());
            }
            Ok(Db::Sqlite(c))
        }
    }

    /// Stores a batch in one transaction; returns the rows newly inserted (those not already
    /// there from an earlier delivery) and how many entries deleted while pending were
    /// recorded (those with reason [`DELETED_WHILE_PENDING`] whose id is not stored already).
    pub fn store<'a>(
        &mut self,
        rows: &'a [Row],
        rejects: &[Malformed],
    ) -> Result<(Vec<&'a Row>, usize), Error> {
        let mut inserted = Vec::new();
        let mut deleted = 0usize;
        match self {
            Db::Sqlite(c) => {
                let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                {
                    let mut ins = tx.prepare_cached(INSERT_ROW)?;
                    for r in rows {
                        let n = ins.execute(rusqlite::params![
                            r.stream,
                            r.entry_id,
                            r.key,
                            r.event,
                            r.id,
                            r.held,
                            r.charged,
                            r.used,
                            r.period_start,
                            r.at_ms
                        ])?;
                        if n > 0 {
                            inserted.push(r);
                        }
                    }
                    let mut rej = tx.prepare_cached(INSERT_REJECT)?;
                    let mut del = tx.prepare_cached(INSERT_DELETED)?;
                    for m in rejects {
                        let p = rusqlite::params![m.stream, m.entry_id, m.reason];
                        if m.reason == DELETED_WHILE_PENDING {
                            deleted += del.execute(p)?;
                        } else {
                            rej.execute(p)?;
                        }
                    }
                }
                tx.commit()?;
            }
            Db::Postgres(c) => {
                let mut tx = c.transaction()?;
                let ins = tx.prepare(INSERT_ROW)?;
                for r in rows {
                    let n = tx.execute(
                        &ins,
                        &[
                            &r.stream,
                            &r.entry_id,
                            &r.key,
                            &r.event,
                            &r.id,
                            &r.held,
                            &r.charged,
                            &r.used,
                            &r.period_start,
                            &r.at_ms,
                        ],
                    )?;
                    if n > 0 {
                        inserted.push(r);
                    }
                }
                let rej = tx.prepare(INSERT_REJECT)?;
                let del = tx.prepare(INSERT_DELETED)?;
                for m in rejects {
                    let p: [&(dyn postgres::types::ToSql + Sync); 3] =
                        [&m.stream, &m.entry_id, &m.reason];
                    if m.reason == DELETED_WHILE_PENDING {
                        let n = tx.execute(&del, &p)?;
                        deleted += usize::try_from(n).unwrap_or(0);
                    } else {
                        tx.execute(&rej, &p)?;
                    }
                }
                tx.commit()?;
            }
        }
        Ok((inserted, deleted))
    }

    /// Every `(budget key, stream)` pair the table holds, sorted.
    pub fn keys(&mut self) -> Result<Vec<(String, String)>, Error> {
        const Q: &str = "SELECT DISTINCT budget_key, stream FROM quota_usage ORDER BY 1, 2";
        Ok(match self {
            Db::Sqlite(c) => {
                let mut st = c.prepare(Q)?;
                let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
                rows.collect::<Result<Vec<_>, _>>()?
            }
            Db::Postgres(c) => c
                .query(Q, &[])?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect(),
        })
    }

    /// The sum of `charged` of `key`'s rows in the period starting at `period_start` (-1:
    /// without a period): what the budget's `used` must be.
    pub fn charged(&mut self, key: &str, period_start: i64) -> Result<i64, Error> {
        const Q: &str = "SELECT COALESCE(SUM(charged), 0) FROM quota_usage
            WHERE budget_key = $1 AND period_start = $2";
        Ok(match self {
            Db::Sqlite(c) => c.query_row(Q, rusqlite::params![key, period_start], |r| r.get(0))?,
            Db::Postgres(c) => {
                // SUM of BIGINT is NUMERIC in PostgreSQL.
                let q = "SELECT COALESCE(SUM(charged), 0)::BIGINT FROM quota_usage
                    WHERE budget_key = $1 AND period_start = $2";
                c.query_one(q, &[&key, &period_start])?.get(0)
            }
        })
    }

    /// The latest `period_start` of `key`'s rows (-1 when it has none with a period): the
    /// period shown for a budget no longer in Redis.
    pub fn latest_period(&mut self, key: &str) -> Result<i64, Error> {
        const Q: &str = "SELECT COALESCE(MAX(period_start), -1) FROM quota_usage
            WHERE budget_key = $1";
        Ok(match self {
            Db::Sqlite(c) => c.query_row(Q, rusqlite::params![key], |r| r.get(0))?,
            Db::Postgres(c) => c.query_one(Q, &[&key])?.get(0),
        })
    }

    /// In one read transaction (one view of the database): the entries of `stream` up to
    /// `upto` it accounts for (bounded by id, so that entries added after a snapshot of the
    /// stream and stored since do not count),
    /// and for each of `ids` (of `stream`) whether the database holds it (a row or a reject).
    pub fn accounted_and_held(
        &mut self,
        stream: &str,
        upto: (u64, u64),
        ids: &[String],
    ) -> Result<(i64, Vec<bool>), Error> {
        const HELD: &str =
            "SELECT (SELECT COUNT(*) FROM quota_usage WHERE stream = $1 AND entry_id = $2)
            + (SELECT COUNT(*) FROM quota_usage_rejects WHERE stream = $1 AND entry_id = $2)";
        let ms = i64::try_from(upto.0).unwrap_or(i64::MAX);
        let seq = i64::try_from(upto.1).unwrap_or(i64::MAX);
        match self {
            Db::Sqlite(c) => {
                let tx = c.transaction()?;
                let q = accounted_query(
                    "CAST(substr(entry_id, 1, instr(entry_id, '-') - 1) AS INTEGER)",
                    "CAST(substr(entry_id, instr(entry_id, '-') + 1) AS INTEGER)",
                    ["?1", "?2", "?3"],
                );
                let accounted: i64 =
                    tx.query_row(&q, rusqlite::params![stream, ms, seq], |r| r.get(0))?;
                let mut held = Vec::with_capacity(ids.len());
                {
                    let mut st = tx.prepare_cached(HELD)?;
                    for id in ids {
                        let n: i64 = st.query_row(rusqlite::params![stream, id], |r| r.get(0))?;
                        held.push(n > 0);
                    }
                }
                tx.commit()?;
                Ok((accounted, held))
            }
            Db::Postgres(c) => {
                let mut tx = c
                    .build_transaction()
                    .isolation_level(postgres::IsolationLevel::RepeatableRead)
                    .read_only(true)
                    .start()?;
                let q = accounted_query(
                    "split_part(entry_id, '-', 1)::BIGINT",
                    "split_part(entry_id, '-', 2)::BIGINT",
                    ["$1", "$2", "$3"],
                );
                let accounted: i64 = tx.query_one(&q, &[&stream, &ms, &seq])?.get(0);
                let st = tx.prepare(HELD)?;
                let mut held = Vec::with_capacity(ids.len());
                for id in ids {
                    let n: i64 = tx.query_one(&st, &[&stream, id])?.get(0);
                    held.push(n > 0);
                }
                tx.commit()?;
                Ok((accounted, held))
            }
        }
    }

    /// Entries of `stream` recorded as deleted while pending ([`DELETED_WHILE_PENDING`]).
    pub fn deleted_while_pending(&mut self, stream: &str) -> Result<i64, Error> {
        const Q: &str = "SELECT COUNT(*) FROM quota_usage_rejects
            WHERE stream = $1 AND reason = $2";
        Ok(match self {
            Db::Sqlite(c) => {
                c.query_row(Q, rusqlite::params![stream, DELETED_WHILE_PENDING], |r| {
                    r.get(0)
                })?
            }
            Db::Postgres(c) => c.query_one(Q, &[&stream, &DELETED_WHILE_PENDING])?.get(0),
        })
    }

    /// `(usage rows, malformed entries skipped, entries deleted while pending)` stored, for
    /// tests and `reconcile`'s summary.
    pub fn counts(&mut self) -> Result<(i64, i64, i64), Error> {
        const Q1: &str = "SELECT COUNT(*) FROM quota_usage";
        const Q2: &str = "SELECT COUNT(*) FROM quota_usage_rejects WHERE reason <> $1";
        const Q3: &str = "SELECT COUNT(*) FROM quota_usage_rejects WHERE reason = $1";
        let d = DELETED_WHILE_PENDING;
        Ok(match self {
            Db::Sqlite(c) => (
                c.query_row(Q1, [], |r| r.get(0))?,
                c.query_row(Q2, [d], |r| r.get(0))?,
                c.query_row(Q3, [d], |r| r.get(0))?,
            ),
            Db::Postgres(c) => (
                c.query_one(Q1, &[])?.get(0),
                c.query_one(Q2, &[&d])?.get(0),
                c.query_one(Q3, &[&d])?.get(0),
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redact_hides_only_the_password() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("redis://:pw@h:6379/0"), "redis://:***@h:6379/0");
        assert_eq!(redact("redis://h:6379/0"), "redis://h:6379/0");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("usage.db"), "usage.db");
        assert_eq!(redact("redis://u:p@ss@h/0"), "redis://u:***@h/0");
        assert_eq!(redact("u:pw@h:6379"), "u:***@h:6379");
        assert_eq!(redact("redis://u:SECa/bRET@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(
            redact("postgres://u:a?b#c@h/db?x=1"),
            "postgres://u:***@h/db?x=1"
        );
        assert_eq!(
            redact("redis+unix:///tmp/x.sock?db=0&pass=pw"),
            "redis+unix:///tmp/x.sock?db=0&pass=***"
        );
        assert_eq!(
            redact("postgres://h:5432/db?user=q&password=pw"),
            "postgres://h:5432/db?user=q&password=***"
        );
    }
}
