//! `quota-export`: moves redis-quota usage streams into SQLite or PostgreSQL exactly once, and
//! reconciles the database with the budgets. See docs/usage-export.md.

/// `eprintln!` that never panics: a log that cannot be written (a full disk, a closed pipe)
/// must not end the exporter with a panic; the message is dropped.
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod consumer;
mod db;
mod entry;
mod metrics;
mod reconcile;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// A name or target that is not empty or only blanks.
fn non_blank(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        Err("must not be empty or blank".into())
    } else {
        Ok(value.to_string())
    }
}

/// The largest millisecond option (a year).
const MAX_MS: u64 = 365 * 24 * 3_600_000;

/// Any error, reported on stderr with a non-zero exit.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser)]
#[command(
    name = "quota-export",
    version,
    about = "Export redis-quota usage streams into SQLite or PostgreSQL, exactly once"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Consume usage streams with a consumer group and store each entry once (ack after commit).
    Run {
        /// Redis URL, e.g. redis://127.0.0.1:6379/0
        #[arg(long, value_parser = non_blank)]
        redis: String,
        /// Database: a SQLite file path (the default kind) or postgres://user@host/db
        #[arg(long, value_parser = non_blank)]
        db: String,
        /// Usage stream key (repeat for several)
        #[arg(long = "stream", required = true, value_parser = non_blank)]
        streams: Vec<String>,
        /// Consumer group name (created at the start of the stream if missing)
        #[arg(long, default_value = "quota-export", value_parser = non_blank)]
        group: String,
        /// Consumer name: keep it stable across restarts (a restarted consumer first takes back its own pending entries)
        #[arg(long, value_parser = non_blank)]
        consumer: Option<String>,
        /// Exit when caught up (nothing new, nothing claimable)
        #[arg(long)]
        once: bool,
        /// Serve Prometheus metrics on this address, e.g. 127.0.0.1:9187
        #[arg(long)]
        metrics_addr: Option<String>,
        /// Take over entries another consumer left pending for this long (ms; XAUTOCLAIM; at most a year)
        #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(0..=MAX_MS))]
        claim_idle_ms: u64,
        /// Entries per read and per database transaction
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        batch: u32,
        /// How long one read waits for new entries (ms, 1 to 3600000)
        #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
        block_ms: u64,
        /// Connecting to Redis or the database, and each reply, may take this long (ms) before
        /// the run fails
        #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=MAX_MS))]
        timeout_ms: u64,
    },
    /// Compare the database with the budgets: per budget key, the sum of charges and
    /// adjustments in the current period against QUOTA.INFO used. Exits 1 on any mismatch.
    Reconcile {
        /// Redis URL
        #[arg(long, value_parser = non_blank)]
        redis: String,
        /// Database: a SQLite file path or postgres://...
        #[arg(long, value_parser = non_blank)]
        db: String,
        /// Consumer group whose progress is checked (trimmed entries, lag)
        #[arg(long, default_value = "quota-export", value_parser = non_blank)]
        group: String,
        /// Also check this stream (repeat; give run's --stream keys), even if none of its
        /// entries reached the database
        #[arg(long = "stream", value_parser = non_blank)]
        streams: Vec<String>,
        /// Connecting to Redis or the database, and each reply, may take this long (ms)
        #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=MAX_MS))]
        timeout_ms: u64,
    },
}

/// The host name, for the default consumer name.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let db_target = match &cli.command {
        Command::Run { db, .. } | Command::Reconcile { db, .. } => db.clone(),
    };
    let result = match cli.command {
        Command::Run {
            redis,
            db,
            streams,
            group,
            consumer,
            once,
            metrics_addr,
            claim_idle_ms,
            batch,
            block_ms,
            timeout_ms,
        } => {
            let shared = metrics::Shared::default();
            let served = match &metrics_addr {
                Some(addr) => metrics::serve(addr, shared.clone()),
                None => Ok(()),
            };
            served
                .and_then(|()| {
                    consumer::run(
                        consumer::RunOptions {
                            redis,
                            db,
                            streams,
                            group,
                            consumer: consumer
                                .unwrap_or_else(|| format!("quota-export@{}", hostname())),
                            once,
                            batch: usize::try_from(batch).unwrap_or(500),
                            block_ms,
                            claim_idle_ms,
                            timeout: Duration::from_millis(timeout_ms),
                        },
                        shared,
                    )
                })
                .map(|()| true)
        }
        Command::Reconcile {
            redis,
            db,
            group,
            streams,
            timeout_ms,
        } => reconcile::reconcile(
            &redis,
            &db,
            &group,
            &streams,
            Duration::from_millis(timeout_ms),
        ),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            // A driver's error names neither the database nor (for PostgreSQL) its cause.
            let from_db = e.downcast_ref::<postgres::Error>().is_some()
                || e.downcast_ref::<rusqlite::Error>().is_some();
            let text = db::with_sources(&*e);
            if from_db {
                let shown = db::redact(&db_target);
                note!(
                    "quota-export: error: database {shown}: {}",
                    db::scrub(&text, &db_target)
                );
            } else {
                note!("quota-export: error: {text}");
            }
            ExitCode::from(2)
        }
    }
}
