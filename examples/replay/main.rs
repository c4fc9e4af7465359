//! `make demo`: replays the Azure LLM inference trace 2023 through redis-quota in the trace's own
//! time, as a gateway would see it: every request admitted against its tenant's concurrency, RPM,
//! TPM and token-budget limits in one call, held in flight while it "generates", then settled
//! with its real usage. At the end it proves that the module's ledger matches what the clients
//! settled, token for token, and writes an SVG report.
//!
//! # Data
//!
//! `examples/data/azure-llm-inference-2023/` holds both CSVs of the trace (`conv`: a conversation
//! service, `code`: a coding service), columns `TIMESTAMP,ContextTokens,GeneratedTokens`.
//! Source: Azure/AzurePublicDataset, CC-BY 4.0. Attribution: Patel et al., "Splitwise: Efficient
//! generative LLM inference using phase splitting", ISCA 2024. The trace has no tenants, no
//! `max_tokens` and no durations: all three are derived below, deterministically.
//!
//! # Rules
//!
//! * **Order and time.** The two files are merged by `TIMESTAMP` (ties: `conv` before `code`,
//!   then row order). Request `i` starts at its timestamp minus the first one, divided by `SPEED`
//!   (default 60: the trace's 58.5 minutes in about a minute).
//! * **Duration.** A request is in flight for `FIRST_TOKEN_MS + GeneratedTokens × TOKEN_MS` of
//!   trace time (defaults 500 ms to the first token, then 30 ms a token: plausible prefill and
//!   decode speeds), i.e. that divided by `SPEED` in real time.
//! * **Tenants.** Row `r` (0-based, header excluded) of file `s` belongs to tenant `s-(r mod 4)`.
//! * **max_tokens (derived).** `max(16, next power of two ≥ GeneratedTokens)`.
//! * **Reservation.** `ContextTokens + ceil(max_tokens × 1.2)`; the settle is the real
//!   `ContextTokens + GeneratedTokens` (never more).
//! * **Limits.** Four per tenant, on keys under the hash tag `{tenant}`: concurrency (a budget
//!   reserved with 1 and settled with 0), RPM and TPM (window keys over one trace minute, i.e.
//!   `60000 / SPEED` real ms) and a token budget for the run. They are derived from the trace's
//!   own peaks (see [`derive_tenants`]): the `*-0` and `*-1` tenants get twice every peak and are
//!   never denied (checked); `conv-2` gets half its peak concurrency, `code-2` 45 % of its peak
//!   TPM, `conv-3` half its demand as budget, `code-3` 60 % of its peak RPM and 80 % of its demand.
//! * **Admission.** `QUOTA.MRESERVE 4 conc rpm tpm budget 1 1 n n` (reservation `n`), then after
//!   the request's duration `QUOTA.MSETTLE 4 ... id 0 1 a a` (real tokens `a`). On a server
//!   without the multi-key commands, one call per key (see `quota.rs`).
//! * **Concurrency.** One dispatcher sends each admission at its request's time and each settle
//!   at that time plus the request's duration, each as a tokio task over one multiplexed
//!   connection: as many requests in flight as the trace has at each moment (over 100), and
//!   Redis sees the commands in the trace's order even when the machine stalls for a moment.
//! * **Idempotent retries.** `conv-0` and `code-0` use their own ids (`conv-<row>`,
//!   `code-<row>`) and send every admission and every settle twice, as a client retrying after a
//!   lost reply: the second admission must return the same id and take nothing more, the second
//!   settle must answer `duplicate` and charge nothing more.
//!
//! * **Usage export.** The token budgets log every charge to their usage stream
//!   `replay:{tenant}:usage` (`QUOTA.SET ... STREAM`); `quota-export run` moves them into a
//!   SQLite file during the replay, then `run --once` catches up (see `export.rs`).
//!
//! # Checks (exit status 1 if any fails)
//!
//! Per tenant and overall: the budget's `used` from `QUOTA.INFO` equals the client's sum of
//! settled tokens, `reserved` and `pending` are 0 on the budget and on the concurrency key (whose
//! `used` stays 0), `used ≤ limit`; the `*-0` and `*-1` tenants had no denial; every settle
//! answered `settled` with the real tokens and every retry behaved as above. With the export:
//! `quota-export reconcile` passes and the database's sum per budget equals the clients'.
//!
//! # Settings (environment)
//!
//! `SPEED` (default 60), `FIRST_TOKEN_MS` (500), `TOKEN_MS` (30), `TRACE_MINUTES` (replay only
//! the trace's first minutes; default all), `REPORT` (the SVG's path, default
//! `target/demo-report.svg`), `REDIS_URL` (use that server, with the module loaded; it
//! overwrites the keys `replay:{<tenant>}:*`). Without
//! `REDIS_URL` it starts its own `redis-server --port <free port> --loadmodule $QUOTA_MODULE
//! --save '' --dir <temp dir>` (`QUOTA_MODULE` defaults to `target/release/libredis_quota.so`)
//! and stops it at the end. `QUOTA_EXPORT` (the `quota-export` binary; default
//! `target/release/quota-export` if built, else the export is skipped and the output says so)
//! and `EXPORT_DB` (default `target/demo-usage.sqlite`).

pub mod export;
pub mod quota;
mod report;
#[path = "../common/server.rs"]
mod server;
mod trace;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use redis::aio::MultiplexedConnection;

use quota::{Admission, Keys, Limit, Limits, Mode, Quota};
use trace::{Request, SERVICES};

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

const TENANTS_PER_SERVICE: usize = 4;
const KEY_PREFIX: &str = "replay:";
/// One minute of trace time, in µs.
const MINUTE_US: u64 = 60_000_000;
const ATTRIBUTION: &str = "Data: Azure LLM inference trace 2023 (Azure/AzurePublicDataset, CC-BY 4.0) — \
     Patel et al., \"Splitwise: Efficient generative LLM inference using phase splitting\", ISCA 2024.";

/// The run's settings, from the environment.
pub struct Config {
    /// Trace time per real time.
    pub speed: f64,
    /// Trace ms before the first token (prefill and queueing), for every request.
    pub first_token_ms: f64,
    /// Trace ms a generated token keeps its request in flight.
    pub token_ms: f64,
    /// Replay only requests in the trace's first minutes.
    pub minutes: Option<f64>,
    /// Where the SVG report goes.
    pub report: PathBuf,
    /// A running server to use; `None`: start one.
    pub redis_url: Option<String>,
    /// The usage export (`quota-export` into SQLite), or why it is skipped.
    pub export: std::result::Result<export::Export, String>,
}

impl Config {
    fn from_env() -> Result<Config> {
        let number = |name: &str, default: Option<f64>| -> Result<Option<f64>> {
            match std::env::var(name) {
                Ok(v) if !v.trim().is_empty() => match v.trim().parse::<f64>() {
                    Ok(x) if x.is_finite() && x > 0.0 => Ok(Some(x)),
                    _ => Err(format!("{name}={v:?}: expected a positive number").into()),
                },
                _ => Ok(default),
            }
        };
        let report = match std::env::var_os("REPORT") {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/demo-report.svg"),
        };
        Ok(Config {
            speed: number("SPEED", Some(60.0))?.unwrap_or(60.0),
            first_token_ms: number("FIRST_TOKEN_MS", Some(500.0))?.unwrap_or(500.0),
            token_ms: number("TOKEN_MS", Some(30.0))?.unwrap_or(30.0),
            minutes: number("TRACE_MINUTES", None)?,
            report,
            redis_url: std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()),
            export: export::Export::from_env()?,
        })
    }

    /// A span of trace time (µs) in real time.
    fn real(&self, trace_us: u64) -> Duration {
        Duration::from_secs_f64(trace_us as f64 / 1e6 / self.speed)
    }

    /// How long request `r` is in flight, in trace µs: the first token, then one per
    /// generated token.
    fn hold_us(&self, r: &Request) -> u64 {
        ((self.first_token_ms + r.generated as f64 * self.token_ms) * 1000.0).round() as u64
    }
}

/// The trace's own load of one tenant (every request admitted, each held for its duration).
#[derive(Clone, Copy, Default, Debug)]
struct Peaks {
    /// Most requests in flight at once.
    concurrency: u64,
    /// Most requests in any trailing minute.
    rpm: u64,
    /// Most reserved tokens in any trailing minute (what a TPM window counts before settles).
    tpm: u64,
}

/// A tenant's setup, derived from the trace.
struct Tenant {
    name: String,
    quota: Quota,
    /// What its limits are, in words.
    plan: &'static str,
    /// Limits at twice every peak: never denied (checked).
    never_denied: bool,
    own_ids: bool,
    demand: u64,
    peaks: Peaks,
}

/// When a command was dispatched: trace µs on the real clock (× SPEED), and its place in the
/// order of dispatch (the order the server sees).
#[derive(Clone, Copy, Debug)]
struct Sent {
    at: u64,
    seq: u64,
}

/// What happened to one request.
#[derive(Clone, Copy, Debug)]
struct Outcome {
    admitted: Sent,
    verdict: Verdict,
}

#[derive(Clone, Copy, Debug)]
enum Verdict {
    /// Granted, not settled yet.
    InFlight,
    Granted {
        settled: Sent,
    },
    Denied(Limit),
}

/// Running totals for the progress bar.
#[derive(Default)]
struct Live {
    requests: u64,
    granted: u64,
    denied: [u64; 4],
    in_flight: u64,
    reserve_retries: u64,
    settle_duplicates: u64,
}

/// Shared by the request tasks.
struct Replay {
    config: Config,
    mode: Mode,
    requests: Vec<Request>,
    tenants: Vec<Tenant>,
    started: Instant,
    live: Mutex<Live>,
    outcomes: Mutex<Vec<Option<Outcome>>>,
    /// The first error of any task; stops the dispatcher.
    failed: Mutex<Option<String>>,
}

impl Replay {
    /// Trace µs since the replay started, on the real clock.
    fn trace_now(&self) -> u64 {
        (self.started.elapsed().as_secs_f64() * self.config.speed * 1e6) as u64
    }
}

fn main() -> ExitCode {
    match Config::from_env().and_then(run) {
        Ok(Finished {
            reconciled: true, ..
        }) => ExitCode::SUCCESS,
        Ok(_) => {
            eprintln!("replay: RECONCILIATION FAILED (see the lines marked MISMATCH above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("replay: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// How a replay ended.
pub struct Finished {
    /// Every check passed.
    pub reconciled: bool,
    /// The commands it used.
    pub mode: Mode,
    /// Denials over all tenants, by limit (in [`Limit::ALL`] order).
    pub denied: [u64; 4],
    /// The usage was exported and `quota-export reconcile` ran (its verdict is in
    /// `reconciled`); false when the export was skipped.
    pub exported: bool,
}

/// Loads, provisions, replays, reconciles, reports. `reconciled` is false when a check failed.
/// The server (when started here) is stopped when this returns, whatever the outcome.
pub fn run(config: Config) -> Result<Finished> {
    let mut requests = trace::load()?;
    if let Some(minutes) = config.minutes {
        let end = (minutes * MINUTE_US as f64) as u64;
        requests.retain(|r| r.at_us < end);
    }
    if requests.is_empty() {
        return Err("no request to replay (TRACE_MINUTES too small?)".into());
    }

    let (url, _server, where_) = match config.redis_url.clone() {
        Some(url) => (url.clone(), None, format!("REDIS_URL={url}")),
        None => {
            let module =
                server::module_path("build it with `cargo build --release` (or run `make demo`)")?;
            let server = server::Server::spawn("replay", &module, &[], None)?;
            let url = format!("redis://127.0.0.1:{}/", server.port);
            let where_ = format!(
                "own redis-server on 127.0.0.1:{} with {}",
                server.port,
                module.display()
            );
            (url, Some(server), where_)
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(replay(config, requests, &url, &where_))
}

async fn replay(
    config: Config,
    requests: Vec<Request>,
    url: &str,
    where_: &str,
) -> Result<Finished> {
    let client = redis::Client::open(url).map_err(|e| format!("invalid Redis URL {url:?}: {e}"))?;
    // The default response timeout (500 ms) is for latency-sensitive services; a demo on a
    // busy machine waits.
    let settings = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(30)))
        .set_connection_timeout(Some(Duration::from_secs(10)));
    let mut con = client
        .get_multiplexed_async_connection_with_config(&settings)
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;
    let mode = quota::detect(&mut con).await?;
    let tenants = derive_tenants(&requests, &config);

    let span_us = requests.last().map_or(0, |r| r.at_us);
    let per_service: Vec<usize> = (0..SERVICES.len())
        .map(|s| requests.iter().filter(|r| r.service == s).count())
        .collect();
    println!(
        "redis-quota replay: {} requests of the Azure LLM inference trace 2023 \
         (conv {} + code {}) over {} of trace time, {} tenants",
        thousands(requests.len() as u64),
        thousands(per_service[0] as u64),
        thousands(per_service[1] as u64),
        clock(span_us),
        tenants.len(),
    );
    println!(
        "time: SPEED={}× (about {:.0} s); each request in flight FIRST_TOKEN_MS={} ms + \
         GeneratedTokens × TOKEN_MS={} ms of trace time; one window = {} ms real",
        config.speed,
        span_us as f64 / 1e6 / config.speed,
        config.first_token_ms,
        config.token_ms,
        tenants[0].quota.window_ms,
    );
    println!(
        "server: {where_}; {}",
        match mode {
            Mode::Multi => "one QUOTA.MRESERVE and one QUOTA.MSETTLE per request",
            Mode::Single =>
                "no QUOTA.MRESERVE on this server: one call per limit (not atomic across limits)",
        }
    );
    println!();
    print_limits(&tenants);
    println!();

    let usage = config.export.is_ok();
    for t in &tenants {
        quota::provision(&mut con, mode, &t.quota, usage).await?;
    }
    let streams: Vec<String> = tenants.iter().map(|t| t.quota.keys.usage.clone()).collect();
    let exporter = match &config.export {
        Ok(export) => {
            println!(
                "export: usage streams replay:{{<tenant>}}:usage of the {} token budgets, \
                 exported during the replay by `{} run` into {} (log: {})",
                tenants.len(),
                export.bin.display(),
                export.db.display(),
                export.log().display(),
            );
            Some((export.clone(), export.start(url, &streams)?))
        }
        Err(why) => {
            println!("export: skipped, usage streams off: {why}");
            None
        }
    };
    println!();

    let count = requests.len();
    let replay = Arc::new(Replay {
        config,
        mode,
        requests,
        tenants,
        started: Instant::now(),
        live: Mutex::new(Live::default()),
        outcomes: Mutex::new(vec![None; count]),
        failed: Mutex::new(None),
    });

    let bar = progress_bar(span_us);
    let ticker = tokio::spawn(tick(Arc::clone(&replay), bar.clone()));
    let lag = dispatch(&replay, &con).await;
    ticker.abort();
    let elapsed = replay.started.elapsed();
    bar.finish_and_clear();
    if let Some(e) = replay.failed.lock().unwrap().take() {
        return Err(e.into());
    }

    let outcomes: Vec<Outcome> = replay
        .outcomes
        .lock()
        .unwrap()
        .iter()
        .map(|o| match o {
            Some(Outcome {
                verdict: Verdict::InFlight,
                ..
            })
            | None => Err("a request was never admitted or never settled"),
            Some(o) => Ok(*o),
        })
        .collect::<std::result::Result<_, _>>()?;
    let (reserve_retries, settle_duplicates) = {
        let live = replay.live.lock().unwrap();
        (live.reserve_retries, live.settle_duplicates)
    };
    let commands = quota::commands();
    let stats = tenant_stats(&replay, &outcomes);
    print_outcome(&replay.tenants, &stats);
    println!();
    let mut ok = reconcile(&mut con, &replay.tenants, &stats).await?;
    println!();
    let exported = exporter.is_some();
    if let Some((export, running)) = exporter {
        println!(
            "export: caught up with `quota-export run --once`, then `quota-export reconcile` \
             (the database's charges against the budgets' used):"
        );
        let (passed, charged) = export.finish(running, url, &streams)?;
        ok &= passed;
        ok &= reconcile_db(&replay.tenants, &stats, &charged);
        println!();
    }
    let own: Vec<&str> = replay
        .tenants
        .iter()
        .filter(|t| t.own_ids)
        .map(|t| t.name.as_str())
        .collect();
    println!(
        "idempotent retries ({}): {} admission retries returned the same id and took nothing more; \
         {} settle retries answered \"duplicate\" and charged nothing more",
        own.join(", "),
        thousands(reserve_retries),
        thousands(settle_duplicates),
    );
    let secs = elapsed.as_secs_f64().max(1e-9);
    println!(
        "time: {} of trace in {secs:.1} s ({:.1}× real time), at most {} ms behind the trace's \
         schedule; peak {} requests in flight; {} QUOTA.* commands ({} a second)",
        clock(span_us),
        span_us as f64 / 1e6 / secs,
        lag.as_millis(),
        peak_in_flight(&outcomes),
        thousands(commands),
        thousands((commands as f64 / secs) as u64),
    );
    let data = report_data(&replay, &outcomes, &stats);
    report::write_svg(&replay.config.report, &data)?;
    println!("report: {}", replay.config.report.display());
    println!("{ATTRIBUTION}");
    let mut denied = [0; 4];
    for s in &stats {
        for (a, b) in denied.iter_mut().zip(s.denied) {
            *a += b;
        }
    }
    Ok(Finished {
        reconciled: ok,
        mode: replay.mode,
        denied,
        exported,
    })
}

/// Sends every admission and every settle in the trace's order: an admission at its request's
/// time, a settle (of a granted request) at that time plus the request's duration; an end comes
/// before a start at the same time. Commands go out over one multiplexed connection in the order
/// they are dispatched, so the server sees the trace's order even when this process or the
/// machine stalls for a moment: the overdue events then go out together, still in order (a
/// settle whose admission has not been answered yet waits for that answer). Returns the largest
/// lag behind the trace's schedule, in real time.
async fn dispatch(replay: &Arc<Replay>, con: &MultiplexedConnection) -> Duration {
    // Answers to admissions: (request, its id if granted), one per admission.
    let (answers, mut answered) =
        tokio::sync::mpsc::unbounded_channel::<(usize, Option<Vec<u8>>)>();
    let mut known: HashMap<usize, Option<Vec<u8>>> = HashMap::new();
    // Every admitted request's end: (due, request).
    let mut ends: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut tasks = tokio::task::JoinSet::new();
    let (mut next, mut seq, mut lag) = (0usize, 0u64, Duration::ZERO);
    loop {
        if replay.failed.lock().unwrap().is_some() {
            break;
        }
        let start = replay.requests.get(next).map(|r| r.at_us);
        let end = ends.peek().map(|Reverse((t, _))| *t);
        let (due, is_end) = match (start, end) {
            (None, None) => break,
            (Some(s), Some(e)) => (s.min(e), e <= s),
            (Some(s), None) => (s, false),
            (None, Some(e)) => (e, true),
        };
        let at = replay.started + replay.config.real(due);
        tokio::time::sleep_until(at.into()).await;
        let (replay_, con) = (Arc::clone(replay), con.clone());
        if is_end {
            let Some(Reverse((_, i))) = ends.pop() else {
                continue;
            };
            let answer = loop {
                if let Some(answer) = known.remove(&i) {
                    break answer;
                }
                match answered.recv().await {
                    Some((j, answer)) => {
                        known.insert(j, answer);
                    }
                    None => break None,
                }
            };
            let Some(id) = answer else {
                continue; // denied: nothing to settle
            };
            lag = lag.max(Instant::now().saturating_duration_since(at));
            let sent = Sent {
                at: replay.trace_now(),
                seq,
            };
            seq += 1;
            tasks.spawn(async move {
                if let Err(e) = settle(&replay_, i, id, sent, con).await {
                    replay_.failed.lock().unwrap().get_or_insert(e.to_string());
                }
            });
        } else {
            lag = lag.max(Instant::now().saturating_duration_since(at));
            let sent = Sent {
                at: replay.trace_now(),
                seq,
            };
            seq += 1;
            let (i, answers) = (next, answers.clone());
            let r = &replay.requests[i];
            ends.push(Reverse((r.at_us + replay.config.hold_us(r), i)));
            next += 1;
            tasks.spawn(async move {
                let answer = admit(&replay_, i, sent, con).await.unwrap_or_else(|e| {
                    replay_.failed.lock().unwrap().get_or_insert(e.to_string());
                    None
                });
                let _ = answers.send((i, answer));
            });
        }
        // Take the answers that are in, and reap finished tasks (the set would hold them all).
        while let Ok((j, answer)) = answered.try_recv() {
            known.insert(j, answer);
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    lag
}

/// Admits request `i` (and retries it, for the tenants with their own ids): its id if granted.
async fn admit(
    replay: &Replay,
    i: usize,
    sent: Sent,
    mut con: MultiplexedConnection,
) -> Result<Option<Vec<u8>>> {
    let r = &replay.requests[i];
    let tenant = &replay.tenants[r.tenant()];
    let (q, mode, amount) = (&tenant.quota, replay.mode, r.reservation());
    let own_id = tenant.own_ids.then(|| r.own_id());
    let admission = quota::admit(&mut con, mode, q, amount, own_id.as_deref()).await?;
    let id = match admission {
        Admission::Denied(limit) => {
            {
                let mut live = replay.live.lock().unwrap();
                live.requests += 1;
                live.denied[limit.index()] += 1;
            }
            replay.outcomes.lock().unwrap()[i] = Some(Outcome {
                admitted: sent,
                verdict: Verdict::Denied(limit),
            });
            return Ok(None);
        }
        Admission::Granted(id) => id,
    };
    if let Some(own) = &own_id {
        // A retry after a lost reply: the same id back, nothing taken twice.
        let again = quota::admit_again(&mut con, mode, q, amount, own).await?;
        if again != Admission::Granted(own.clone().into_bytes()) {
            return Err(format!(
                "{}: the retried admission of {own} answered {again:?}, expected the same id",
                tenant.name
            )
            .into());
        }
    }
    replay.outcomes.lock().unwrap()[i] = Some(Outcome {
        admitted: sent,
        verdict: Verdict::InFlight,
    });
    let mut live = replay.live.lock().unwrap();
    live.requests += 1;
    live.granted += 1;
    live.in_flight += 1;
    if own_id.is_some() {
        live.reserve_retries += 1;
    }
    Ok(Some(id))
}

/// Settles granted request `i` with its real tokens (twice, for the tenants with their own ids).
async fn settle(
    replay: &Replay,
    i: usize,
    id: Vec<u8>,
    sent: Sent,
    mut con: MultiplexedConnection,
) -> Result<()> {
    let r = &replay.requests[i];
    let tenant = &replay.tenants[r.tenant()];
    let (q, mode, actual) = (&tenant.quota, replay.mode, r.actual());
    let settled = quota::settle(&mut con, mode, q, &id, actual).await?;
    let id_text = String::from_utf8_lossy(&id);
    if settled.status != "settled" || settled.charged != actual {
        return Err(format!(
            "{}: settle of {id_text} with {actual} answered [{}, {}], expected [settled, {actual}]",
            tenant.name, settled.status, settled.charged
        )
        .into());
    }
    if tenant.own_ids {
        // The same settle again: recognised, not charged twice.
        let again = quota::settle(&mut con, mode, q, &id, actual).await?;
        if again.status != "duplicate" || again.charged != actual {
            return Err(format!(
                "{}: the retried settle of {id_text} with {actual} answered [{}, {}], \
                 expected [duplicate, {actual}]",
                tenant.name, again.status, again.charged
            )
            .into());
        }
    }
    {
        let mut live = replay.live.lock().unwrap();
        live.in_flight -= 1;
        if tenant.own_ids {
            live.settle_duplicates += 1;
        }
    }
    let mut outcomes = replay.outcomes.lock().unwrap();
    let admitted = outcomes[i].map_or(sent, |o| o.admitted);
    outcomes[i] = Some(Outcome {
        admitted,
        verdict: Verdict::Granted { settled: sent },
    });
    Ok(())
}

fn progress_bar(span_us: u64) -> ProgressBar {
    let bar = ProgressBar::new(span_us / 1_000_000);
    bar.set_style(
        ProgressStyle::with_template("{bar:24.cyan/blue} trace {prefix} {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar
}

/// Refreshes the progress bar ten times a second.
async fn tick(replay: Arc<Replay>, bar: ProgressBar) {
    let span = bar.length().unwrap_or(0);
    loop {
        let now = (replay.trace_now() / 1_000_000).min(span);
        bar.set_position(now);
        bar.set_prefix(format!(
            "{}/{}",
            clock(now * 1_000_000),
            clock(span * 1_000_000)
        ));
        let msg = {
            let live = replay.live.lock().unwrap();
            let d = live.denied;
            format!(
                "| {} requests, {} granted, {} denied (concurrency {}, RPM {}, TPM {}, budget {}) | {} in flight",
                thousands(live.requests),
                thousands(live.granted),
                thousands(d.iter().sum()),
                thousands(d[0]),
                thousands(d[1]),
                thousands(d[2]),
                thousands(d[3]),
                live.in_flight,
            )
        };
        bar.set_message(msg);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each tenant's limits, from the trace's own peaks (see the module docs).
fn derive_tenants(requests: &[Request], config: &Config) -> Vec<Tenant> {
    let count = SERVICES.len() * TENANTS_PER_SERVICE;
    let window_ms = ((60_000.0 / config.speed).round() as u64).max(1);
    let longest_hold = requests
        .iter()
        .map(|r| config.hold_us(r))
        .max()
        .unwrap_or(0);
    // Far longer than any request is held, so no reservation expires in flight.
    let ttl_ms = 60_000 + 2 * config.real(longest_hold).as_millis() as u64;
    (0..count)
        .map(|t| {
            let (service, index) = (t / TENANTS_PER_SERVICE, t % TENANTS_PER_SERVICE);
            let mine: Vec<&Request> = requests.iter().filter(|r| r.tenant() == t).collect();
            let demand: u64 = mine.iter().map(|r| r.actual()).sum();
            let largest = mine.iter().map(|r| r.reservation()).max().unwrap_or(0);
            let peaks = peaks(&mine, config);
            let name = format!("{}-{index}", SERVICES[service].0);
            let mut limits = Limits {
                concurrency: 2 * peaks.concurrency.max(1),
                rpm: 2 * peaks.rpm.max(1),
                tpm: 2 * peaks.tpm.max(1),
                budget: 0,
            };
            let mut budget_percent = None;
            let plan = match (SERVICES[service].0, index) {
                ("conv", 2) => {
                    limits.concurrency = (peaks.concurrency / 2).max(1);
                    "concurrency: half its peak"
                }
                ("code", 2) => {
                    limits.tpm = (peaks.tpm * 45 / 100).max(1);
                    "TPM: 45% of its peak"
                }
                ("conv", 3) => {
                    budget_percent = Some(50);
                    "budget: 50% of its demand"
                }
                ("code", 3) => {
                    limits.rpm = (peaks.rpm * 60 / 100).max(1);
                    budget_percent = Some(80);
                    "RPM: 60% of peak; budget: 80%"
                }
                _ => "2x every peak: never denied",
            };
            // Without a percentage: the demand plus room for every reservation that can be in
            // flight at once, so the budget never denies.
            limits.budget = match budget_percent {
                Some(p) => demand * p / 100,
                None => demand + limits.concurrency * largest,
            };
            Tenant {
                quota: Quota {
                    keys: Keys::new(KEY_PREFIX, &name),
                    limits,
                    window_ms,
                    ttl_ms,
                },
                name,
                plan,
                never_denied: index <= 1,
                own_ids: index == 0,
                demand,
                peaks,
            }
        })
        .collect()
}

/// The trace's peaks for one tenant's requests (in trace order).
fn peaks(requests: &[&Request], config: &Config) -> Peaks {
    // In flight: +1 at start, -1 at end; an end sorts before a start at the same time.
    let mut events: Vec<(u64, i64)> = requests
        .iter()
        .flat_map(|r| [(r.at_us, 1), (r.at_us + config.hold_us(r), -1)])
        .collect();
    events.sort();
    let mut concurrency = 0u64;
    let mut now = 0i64;
    for (_, step) in events {
        now += step;
        concurrency = concurrency.max(now as u64);
    }
    // Trailing minute (t - 60 s, t]: two pointers over the sorted start times.
    let (mut rpm, mut tpm, mut sum, mut first) = (0u64, 0u64, 0u64, 0usize);
    for (i, r) in requests.iter().enumerate() {
        sum += r.reservation();
        while requests[first].at_us + MINUTE_US <= r.at_us {
            sum -= requests[first].reservation();
            first += 1;
        }
        rpm = rpm.max((i + 1 - first) as u64);
        tpm = tpm.max(sum);
    }
    Peaks {
        concurrency,
        rpm,
        tpm,
    }
}

/// Most requests in flight at once over all tenants, in the order the server saw the commands.
fn peak_in_flight(outcomes: &[Outcome]) -> u64 {
    let mut events: Vec<(u64, i64)> = outcomes
        .iter()
        .filter_map(|o| match o.verdict {
            Verdict::Granted { settled } => Some([(o.admitted.seq, 1), (settled.seq, -1)]),
            Verdict::Denied(_) | Verdict::InFlight => None,
        })
        .flatten()
        .collect();
    events.sort();
    let (mut now, mut most) = (0i64, 0i64);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    most as u64
}

/// What the clients saw for one tenant.
#[derive(Default, Clone, Debug)]
struct TenantStats {
    requests: u64,
    granted: u64,
    denied: [u64; 4],
    settled_tokens: u64,
    peak_in_flight: u64,
}

impl TenantStats {
    fn denied_total(&self) -> u64 {
        self.denied.iter().sum()
    }
}

fn tenant_stats(replay: &Replay, outcomes: &[Outcome]) -> Vec<TenantStats> {
    let mut stats = vec![TenantStats::default(); replay.tenants.len()];
    let mut events: Vec<Vec<(u64, i64)>> = vec![Vec::new(); replay.tenants.len()];
    for (r, o) in replay.requests.iter().zip(outcomes) {
        let s = &mut stats[r.tenant()];
        s.requests += 1;
        match o.verdict {
            Verdict::Granted { settled } => {
                s.granted += 1;
                s.settled_tokens += r.actual();
                events[r.tenant()].push((o.admitted.seq, 1));
                events[r.tenant()].push((settled.seq, -1));
            }
            Verdict::Denied(limit) => s.denied[limit.index()] += 1,
            Verdict::InFlight => {}
        }
    }
    for (s, mut ev) in stats.iter_mut().zip(events) {
        ev.sort();
        let mut now = 0i64;
        for (_, step) in ev {
            now += step;
            s.peak_in_flight = s.peak_in_flight.max(now as u64);
        }
    }
    stats
}

fn print_limits(tenants: &[Tenant]) {
    println!(
        "{:<8} {:<37} {:>11} {:>11} {:>11} {:>12}   {:>24}",
        "tenant", "limits", "concurrency", "RPM", "TPM", "budget", "trace peaks: conc/RPM/TPM"
    );
    for t in tenants {
        let l = &t.quota.limits;
        let plan = if t.own_ids {
            format!("{}; own ids", t.plan)
        } else {
            t.plan.to_string()
        };
        println!(
            "{:<8} {:<37} {:>11} {:>11} {:>11} {:>12}   {:>24}",
            t.name,
            plan,
            thousands(l.concurrency),
            thousands(l.rpm),
            thousands(l.tpm),
            thousands(l.budget),
            format!(
                "{} / {} / {}",
                t.peaks.concurrency,
                t.peaks.rpm,
                thousands(t.peaks.tpm)
            ),
        );
    }
}

fn print_outcome(tenants: &[Tenant], stats: &[TenantStats]) {
    println!(
        "{:<8} {:>12} {:>9} {:>8} {:>7} {:>6} {:>6} {:>6} {:>7} {:>12} {:>10}",
        "tenant",
        "demand",
        "requests",
        "granted",
        "denied",
        "conc",
        "RPM",
        "TPM",
        "budget",
        "tokens used",
        "in flight"
    );
    let mut total = TenantStats::default();
    for (t, s) in tenants.iter().zip(stats) {
        println!(
            "{:<8} {:>12} {:>9} {:>8} {:>7} {:>6} {:>6} {:>6} {:>7} {:>12} {:>10}",
            t.name,
            thousands(t.demand),
            thousands(s.requests),
            thousands(s.granted),
            thousands(s.denied_total()),
            thousands(s.denied[0]),
            thousands(s.denied[1]),
            thousands(s.denied[2]),
            thousands(s.denied[3]),
            thousands(s.settled_tokens),
            format!("{} max", s.peak_in_flight),
        );
        total.requests += s.requests;
        total.granted += s.granted;
        for (a, b) in total.denied.iter_mut().zip(s.denied) {
            *a += b;
        }
        total.settled_tokens += s.settled_tokens;
    }
    println!(
        "{:<8} {:>12} {:>9} {:>8} {:>7} {:>6} {:>6} {:>6} {:>7} {:>12}",
        "total",
        thousands(tenants.iter().map(|t| t.demand).sum()),
        thousands(total.requests),
        thousands(total.granted),
        thousands(total.denied_total()),
        thousands(total.denied[0]),
        thousands(total.denied[1]),
        thousands(total.denied[2]),
        thousands(total.denied[3]),
        thousands(total.settled_tokens),
    );
}

/// `QUOTA.INFO key` as integers: used, reserved, pending, limit.
async fn info(con: &mut MultiplexedConnection, key: &str) -> Result<(i64, i64, i64, i64)> {
    // Every field is read as a generic value: QUOTA.INFO also has text fields (and may gain
    // more); only the integer fields below are used.
    let info: Option<HashMap<String, redis::Value>> = redis::cmd("QUOTA.INFO")
        .arg(key)
        .query_async(con)
        .await
        .map_err(|e| format!("QUOTA.INFO {key}: {e}"))?;
    let info = info.ok_or_else(|| format!("QUOTA.INFO {key}: the budget is gone"))?;
    let field = |name: &str| match info.get(name) {
        Some(redis::Value::Int(n)) => Ok(*n),
        Some(other) => Err(format!(
            "QUOTA.INFO {key}: field {name} is not an integer: {other:?}"
        )),
        None => Err(format!("QUOTA.INFO {key}: no {name} field")),
    };
    Ok((
        field("used")?,
        field("reserved")?,
        field("pending")?,
        field("limit")?,
    ))
}

/// Compares QUOTA.INFO with the clients' view; prints one line per tenant and one overall.
async fn reconcile(
    con: &mut MultiplexedConnection,
    tenants: &[Tenant],
    stats: &[TenantStats],
) -> Result<bool> {
    let mut all_ok = true;
    let (mut redis_used, mut client_used, mut reserved_sum, mut pending_sum) = (0i64, 0u64, 0, 0);
    for (t, s) in tenants.iter().zip(stats) {
        let (used, reserved, pending, limit) = info(con, &t.quota.keys.budget).await?;
        let (slot_used, slot_reserved, slot_pending, _) =
            info(con, &t.quota.keys.concurrency).await?;
        let mut problems = Vec::new();
        if u64::try_from(used).ok() != Some(s.settled_tokens) {
            problems.push("used != client settled".to_string());
        }
        if reserved != 0 || pending != 0 {
            problems.push("budget reserved/pending != 0".to_string());
        }
        if slot_used != 0 || slot_reserved != 0 || slot_pending != 0 {
            problems.push(format!(
                "concurrency key used {slot_used}, reserved {slot_reserved}, pending {slot_pending} (expected 0)"
            ));
        }
        if used > limit {
            problems.push("used > limit".to_string());
        }
        if t.never_denied && s.denied_total() != 0 {
            problems.push(format!(
                "a tenant with twice every peak was denied {} times",
                s.denied_total()
            ));
        }
        let verdict = if problems.is_empty() {
            "OK".to_string()
        } else {
            all_ok = false;
            format!("MISMATCH: {}", problems.join(", "))
        };
        let same = if u64::try_from(used).ok() == Some(s.settled_tokens) {
            "=="
        } else {
            "!="
        };
        println!(
            "reconcile {:<7} used in Redis {:>11} {same} settled by clients {:>11}; \
             reserved {}, pending {}, in flight {}  {verdict}",
            t.name,
            thousands_i(used),
            thousands(s.settled_tokens),
            reserved + slot_reserved,
            pending + slot_pending,
            slot_reserved,
        );
        redis_used += used;
        client_used += s.settled_tokens;
        reserved_sum += reserved + slot_reserved;
        pending_sum += pending + slot_pending;
    }
    let overall_ok = all_ok
        && u64::try_from(redis_used).ok() == Some(client_used)
        && reserved_sum == 0
        && pending_sum == 0;
    let same = if u64::try_from(redis_used).ok() == Some(client_used) {
        "=="
    } else {
        "!="
    };
    println!(
        "reconcile {:<7} used in Redis {:>11} {same} settled by clients {:>11}; \
         reserved {reserved_sum}, pending {pending_sum}  {}",
        "ALL",
        thousands_i(redis_used),
        thousands(client_used),
        if overall_ok { "OK" } else { "MISMATCH" },
    );
    Ok(overall_ok)
}

/// Compares the database's charges per token budget (from `quota-export reconcile`) with what
/// the clients settled, from the trace; prints one line overall, or one per mismatch.
fn reconcile_db(tenants: &[Tenant], stats: &[TenantStats], charged: &HashMap<String, u64>) -> bool {
    let mut ok = true;
    let (mut db_sum, mut client_sum) = (0u64, 0u64);
    for (t, s) in tenants.iter().zip(stats) {
        let db = charged.get(&t.quota.keys.budget).copied();
        if db != Some(s.settled_tokens) {
            ok = false;
            println!(
                "reconcile {:<7} in the database {} != settled by clients {}  MISMATCH",
                t.name,
                db.map_or("no rows".into(), thousands),
                thousands(s.settled_tokens),
            );
        }
        db_sum += db.unwrap_or(0);
        client_sum += s.settled_tokens;
    }
    println!(
        "reconcile database: {} tokens charged in the database {} {} settled by clients ({} tenants)  {}",
        thousands(db_sum),
        if db_sum == client_sum { "==" } else { "!=" },
        thousands(client_sum),
        tenants.len(),
        if ok { "OK" } else { "MISMATCH" },
    );
    ok
}

/// The report's series: per tenant, sampled every `STEP_US` of trace time.
fn report_data(replay: &Replay, outcomes: &[Outcome], stats: &[TenantStats]) -> report::Report {
    const STEP_US: u64 = 10_000_000;
    let end_us = outcomes
        .iter()
        .map(|o| match o.verdict {
            Verdict::Granted { settled } => settled.at,
            Verdict::Denied(_) | Verdict::InFlight => o.admitted.at,
        })
        .max()
        .unwrap_or(0);
    let samples: Vec<u64> = (0..=end_us / STEP_US + 1).map(|k| k * STEP_US).collect();
    let minutes = |us: u64| us as f64 / MINUTE_US as f64;
    let tenants = replay
        .tenants
        .iter()
        .enumerate()
        .map(|(t, tenant)| {
            let mine: Vec<(&Request, &Outcome)> = replay
                .requests
                .iter()
                .zip(outcomes)
                .filter(|(r, _)| r.tenant() == t)
                .collect();
            // Tokens admitted / denied in the trailing minute, by the time of the answer.
            let trailing = |granted: bool| -> Vec<(f64, f64)> {
                samples
                    .iter()
                    .map(|&s| {
                        let sum: u64 = mine
                            .iter()
                            .filter(|(_, o)| {
                                matches!(o.verdict, Verdict::Granted { .. }) == granted
                                    && o.admitted.at <= s
                                    && o.admitted.at + MINUTE_US > s
                            })
                            .map(|(r, _)| r.actual())
                            .sum();
                        (minutes(s), sum as f64)
                    })
                    .collect()
            };
            // Most requests in flight within each step (events in the order the server saw them).
            let mut events: Vec<(u64, u64, i64)> = mine
                .iter()
                .filter_map(|(_, o)| match o.verdict {
                    Verdict::Granted { settled } => Some([
                        (o.admitted.seq, o.admitted.at, 1),
                        (settled.seq, settled.at, -1),
                    ]),
                    Verdict::Denied(_) | Verdict::InFlight => None,
                })
                .flatten()
                .collect();
            events.sort();
            let mut in_flight = Vec::with_capacity(samples.len());
            let (mut now, mut next) = (0i64, 0usize);
            for &s in &samples {
                let mut most = now;
                while next < events.len() && events[next].1 < s + STEP_US {
                    now += events[next].2;
                    most = most.max(now);
                    next += 1;
                }
                in_flight.push((minutes(s), most as f64));
            }
            // Budget used: settled tokens by the time of the settle.
            let mut settles: Vec<(u64, u64)> = mine
                .iter()
                .filter_map(|(r, o)| match o.verdict {
                    Verdict::Granted { settled } => Some((settled.at, r.actual())),
                    Verdict::Denied(_) | Verdict::InFlight => None,
                })
                .collect();
            settles.sort();
            let (mut used, mut next) = (0u64, 0usize);
            let used_series = samples
                .iter()
                .map(|&s| {
                    while next < settles.len() && settles[next].0 <= s {
                        used += settles[next].1;
                        next += 1;
                    }
                    (minutes(s), used as f64)
                })
                .collect();
            let st = &stats[t];
            let mut lines = vec![
                format!("{} requests", thousands(st.requests)),
                format!("{} granted", thousands(st.granted)),
            ];
            if st.denied_total() == 0 {
                lines.push("denied: none".to_string());
            }
            for l in Limit::ALL {
                if st.denied[l.index()] > 0 {
                    lines.push(format!(
                        "denied by {}: {}",
                        l.name(),
                        thousands(st.denied[l.index()])
                    ));
                }
            }
            lines.push(format!(
                "used {} of {}",
                thousands(st.settled_tokens),
                thousands(tenant.quota.limits.budget)
            ));
            report::TenantSeries {
                name: tenant.name.clone(),
                plan: if tenant.own_ids {
                    format!("{}; own ids", tenant.plan)
                } else {
                    tenant.plan.to_string()
                },
                lines,
                limits: tenant.quota.limits,
                admitted_tpm: trailing(true),
                denied_tpm: trailing(false),
                in_flight,
                used: used_series,
            }
        })
        .collect();
    let first = replay
        .requests
        .first()
        .map(|r| r.timestamp.as_str())
        .unwrap_or("");
    report::Report {
        title: format!(
            "redis-quota: the Azure LLM inference trace 2023 replayed in its own time ({}x, {} requests, {} tenants)",
            replay.config.speed,
            thousands(replay.requests.len() as u64),
            replay.tenants.len()
        ),
        lines: vec![
            format!(
                "Each request: {}; in flight {} ms + {} ms a generated token (trace time); then settled with its real tokens.",
                match replay.mode {
                    Mode::Multi => "one QUOTA.MRESERVE over its tenant's concurrency, RPM, TPM and budget",
                    Mode::Single => "one call per limit (concurrency, RPM, TPM, budget)",
                },
                replay.config.first_token_ms,
                replay.config.token_ms
            ),
            format!(
                "x: minutes of trace time since {}. Blue: admitted (tokens, requests in flight, tokens settled). \
                 Red: denied. Dashed: the limit.",
                &first[..first.len().min(19)],
            ),
        ],
        attribution: ATTRIBUTION.to_string(),
        minutes: minutes(samples.last().copied().unwrap_or(0)),
        tenants,
    }
}

/// Trace µs as `m:ss` (or `h:mm:ss`).
fn clock(us: u64) -> String {
    let s = us / 1_000_000;
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

/// 1234567 → "1,234,567".
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn thousands_i(n: i64) -> String {
    let sign = if n < 0 { "-" } else { "" };
    format!("{sign}{}", thousands(n.unsigned_abs()))
}
