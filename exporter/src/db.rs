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
            let mut c = postgres::Client::connect(target, postgres::NoTls)?;
            c.batch_execute(SCHEMA)?;
            Ok(Db::Postgres(Box::new(c)))
        } else {
            let path = target.strip_prefix("sqlite://").unwrap_or(target);
            let c = rusqlite::Connection::open(path)?;
            // Several exporters may share one file: wait for the lock instead of failing.
            c.busy_timeout(std::time::Duration::from_secs(60))?;
            c.pragma_update(None, "journal_mode", "WAL")?;
            c.execute_batch(SCHEMA)?;
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
            let mut c = postgres::Client::connect(target, postgres::NoTls)?;
            let found: bool = c
                .query_one(
                    "SELECT to_regclass('quota_usage') IS NOT NULL \
                     AND to_regclass('quota_usage_rejects') IS NOT NULL",
                    &[],
                )?
                .get(0);
            if !found {
                return Err(format!("database {target} {MISSING}").into());
            }
            Ok(Db::Postgres(Box::new(c)))
        } else {
            let path = target.strip_prefix("sqlite://").unwrap_or(target);
            if !std::path::Path::new(path).is_file() {
                return Err(format!(
                    "database {path}: no such file (reconcile opens an existing database only; \
                     `quota-export run` creates it)"
                )
                .into());
            }
            let c = rusqlite::Connection::open_with_flags(
                path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE
                    | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?;
            c.busy_timeout(std::time::Duration::from_secs(60))?;
            let n: i64 = c.query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' \
                 AND name IN ('quota_usage', 'quota_usage_rejects')",
                [],
                |r| r.get(0),
            )?;
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

    /// Rows and rejects stored (for tests and `reconcile`'s summary).
    pub fn counts(&mut self) -> Result<(i64, i64), Error> {
        const Q1: &str = "SELECT COUNT(*) FROM quota_usage";
        const Q2: &str = "SELECT COUNT(*) FROM quota_usage_rejects";
        Ok(match self {
            Db::Sqlite(c) => (
                c.query_row(Q1, [], |r| r.get(0))?,
                c.query_row(Q2, [], |r| r.get(0))?,
            ),
            Db::Postgres(c) => (c.query_one(Q1, &[])?.get(0), c.query_one(Q2, &[])?.get(0)),
        })
    }
}
