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

/// `url` with its password replaced by `***`, for messages (`scheme://user:***@host/...`).
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let hidden = if userinfo.contains(':') || user.is_empty() {
                format!("{user}:***")
            } else {
                user.to_string()
            };
            format!("{scheme}://{hidden}@{host}{path}")
        }
        None => url.to_string(),
    }
}

/// `e` and its sources, `a: b: c` (a PostgreSQL "error connecting to server" says why only in
/// its source).
fn with_sources(e: &dyn std::error::Error) -> String {
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

/// An open database.
pub enum Db {
    Sqlite(rusqlite::Connection),
    Postgres(Box<postgres::Client>),
}

/// Is `target` a PostgreSQL URL (else a SQLite file path)?
pub fn is_postgres(target: &str) -> bool {
    target.starts_with("postgres://") || target.starts_with("postgresql://")
}

impl Db {
    /// Opens `target` (`postgres://...`/`postgresql://...`, else a SQLite path, optionally
    /// `sqlite://path`) and creates the tables if missing.
    pub fn open(target: &str) -> Result<Db, Error> {
        if is_postgres(target) {
            let named =
                |e: postgres::Error| format!("database {}: {}", redact(target), with_sources(&e));
            let mut c = postgres::Client::connect(target, postgres::NoTls).map_err(named)?;
            c.batch_execute(SCHEMA).map_err(named)?;
            Ok(Db::Postgres(Box::new(c)))
        } else {
            let path = target.strip_prefix("sqlite://").unwrap_or(target);
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
    pub fn open_existing(target: &str) -> Result<Db, Error> {
        const MISSING: &str = "has no quota_usage/quota_usage_rejects tables: not a database \
            `quota-export run` wrote to (reconcile never creates them)";
        if is_postgres(target) {
            let shown = redact(target);
            let named = |e: postgres::Error| format!("database {shown}: {}", with_sources(&e));
            let mut c = postgres::Client::connect(target, postgres::NoTls).map_err(named)?;
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
            let path = target.strip_prefix("sqlite://").unwrap_or(target);
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
    /// there from an earlier delivery).
    pub fn store<'a>(
        &mut self,
        rows: &'a [Row],
        rejects: &[Malformed],
    ) -> Result<Vec<&'a Row>, Error> {
        let mut inserted = Vec::new();
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
                    for m in rejects {
                        rej.execute(rusqlite::params![m.stream, m.entry_id, m.reason])?;
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
                for m in rejects {
                    tx.execute(&rej, &[&m.stream, &m.entry_id, &m.reason])?;
                }
                tx.commit()?;
            }
        }
        Ok(inserted)
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
    }
}
