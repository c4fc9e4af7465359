//! `make bench`: redis-quota against the Lua scripts it replaces, in one run on one machine.
//!
//! It starts its own redis-server (free port, `--save ''`, `--appendonly no`, a temp dir, the
//! release module) for each phase and stops it at the end:
//! - **load**: each workload for a fixed time at pipeline depth 1 and 16 from several
//!   connections (one thread each): throughput seen by the clients, and the server-side cost
//!   per call from `INFO commandstats` (`CONFIG RESETSTAT` after each workload's setup). Floors
//!   `INCR` and `HINCRBY`, and the module API floors `FLOOR.WRITE` and `FLOOR.MWRITE`
//!   (bench/floor.rs: only the Redis calls of a granted RESERVE and of a granted 5-key MRESERVE);
//!   the Lua scripts in `bench/lua/` (EVALSHA); the module's commands.
//!   Then the reserve, cycle and window workloads again at depth 16 with the server pinned to
//!   a CPU of its own and the clients to the others (`taskset`), as when clients run on other
//!   hosts: the throughput of the server rather than of the machine it shares.
//! - **memory**: bytes per pending reservation (16-byte ids), per remembered finished id and
//!   per 60 s / 1 s sliding-window key under heavy traffic, module and Lua, from `used_memory`
//!   deltas and `MEMORY USAGE`.
//! - **sweeper**: many pending reservations expiring within a few seconds; the lag between
//!   deadline and release from `INFO quota`.
//!
//! Every figure is reported as a ratio against the baseline measured in the same run, and
//! checked against the goals of issue 5. The report goes to stdout and, between the markers,
//! into `docs/benchmarks.md` (hand-written notes outside the markers are kept).
//!
//! Environment: `BENCH_QUICK=1` (short run, ≤ 60 s), `BENCH_THREADS` (connections, default 4),
//! `BENCH_SECONDS` (per workload and depth), `BENCH_REPEAT` (passes over the load workloads,
//! each keeping its best; default 3, QUICK 1), `BENCH_ONLY=load,memory,sweeper,complexity`,
//! `BENCH_PIN=0` (skip the runs with the server on its own CPU),
//! `BENCH_WORKLOADS=hincrby,cycle` (load workloads whose name contains one of these, any
//! case; default all), `BENCH_SWEEP_EFFORT=1000,20000` (sweeper runs), `BENCH_OUT` (report
//! path, `-` for none; default docs/benchmarks.md, none for QUICK or BENCH_WORKLOADS),
//! `QUOTA_MODULE` (module path, default `target/release/libredis_quota.so`),
//! `QUOTA_FLOOR_MODULE` (the API-floor module of bench/floor.rs, default
//! `target/release/examples/libapifloor.so`; if it is missing, its two rows say "not run").
//!
//! Benchmarks are not tests: nothing here asserts a timing; goals are reported met / not met.

mod complexity;
mod load;
mod memory;
mod report;
mod server;

use std::error::Error;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use load::{Kind, Measure, Run, Scripts};
use server::Server;

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// Pipeline depths every workload runs at.
pub const DEPTHS: [usize; 2] = [1, 16];

/// The depth of the runs with the server on its own CPU (the throughput goal's).
pub const PINNED_DEPTH: usize = 16;

pub struct Config {
    pub quick: bool,
    pub threads: usize,
    /// Passes over the load workloads (each keeps its best).
    pub repeat: usize,
    pub duration: Duration,
    pub sections: Vec<String>,
    /// Load workloads to run (lowercase name fragments); empty: all.
    pub workloads: Vec<String>,
    pub mem_items: usize,
    pub window_keys: usize,
    pub window_rate: usize,
    pub sweep_keys: usize,
    pub sweep_per_key: usize,
    pub sweep_spread_ms: i64,
    pub sweep_efforts: Vec<i64>,
    /// Reservations in the key of each expired-backlog read measurement.
    pub backlog_sizes: Vec<usize>,
    pub out: Option<std::path::PathBuf>,
    /// Also measure throughput with the server on a CPU of its own (`BENCH_PIN`, default on).
    pub pin: bool,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl Config {
    fn from_env() -> Result<Config> {
        let quick = matches!(env("BENCH_QUICK").as_deref(), Some(v) if v != "0");
        let threads = match env("BENCH_THREADS") {
            Some(v) => v.parse()?,
            None => 4,
        };
        let secs: f64 = match env("BENCH_SECONDS") {
            Some(v) => v.parse()?,
            None if quick => 0.5,
            None => 2.0,
        };
        let sections = env("BENCH_ONLY")
            .unwrap_or_else(|| "load,memory,sweeper,complexity".into())
            .split(',')
            .map(|s| s.trim().to_string())
            .collect();
        let workloads: Vec<String> = env("BENCH_WORKLOADS")
            .unwrap_or_default()
            .split(',')
            .map(|s| s.trim().to_lowercase())
            .filter(|s| !s.is_empty())
            .collect();
        let sweep_efforts = env("BENCH_SWEEP_EFFORT")
            .unwrap_or_else(|| "1000,20000".into())
            .split(',')
            .map(|s| s.trim().parse::<i64>())
            .collect::<std::result::Result<Vec<_>, _>>()?;
        // A QUICK run prints only: it must not replace the full run's figures in the doc.
        let out = match env("BENCH_OUT").as_deref() {
            Some("-") => None,
            Some(p) => Some(p.into()),
            // Likewise a run of some workloads only.
            None if quick || !workloads.is_empty() => None,
            None => {
                Some(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/benchmarks.md"))
            }
        };
        let repeat = match env("BENCH_REPEAT") {
            Some(v) => v.parse()?,
            None if quick => 1,
            None => 3,
        };
        Ok(Config {
            quick,
            threads: threads.max(1),
            repeat: repeat.max(1),
            duration: Duration::from_secs_f64(secs),
            sections,
            workloads,
            mem_items: if quick { 100_000 } else { 500_000 },
            window_keys: if quick { 200 } else { 1000 },
            window_rate: 10,
            sweep_keys: if quick { 100 } else { 1000 },
            sweep_per_key: 1000,
            sweep_spread_ms: if quick { 1000 } else { 3000 },
            sweep_efforts,
            backlog_sizes: if quick {
                vec![1_000, 20_000]
            } else {
                vec![1_000, 100_000]
            },
            out,
            pin: !matches!(env("BENCH_PIN").as_deref(), Some("0")),
        })
    }

    fn runs(&self, section: &str) -> bool {
        self.sections.iter().any(|s| s == section)
    }

    fn runs_workload(&self, kind: Kind) -> bool {
        let name = kind.name().to_lowercase();
        self.workloads.is_empty() || self.workloads.iter().any(|w| name.contains(w.as_str()))
    }
}

/// One pass of a load workload, on stderr.
fn log_pass(pass: usize, repeat: usize, m: &Measure, label: &str) {
    let (server_cpu, client_cpu) = m.cpu_per_op();
    let unit = m.kind.unit();
    eprintln!(
        "bench: pass {}/{repeat} {:<28} depth {:>2}: {:>9.0} {unit}/s, {:>6.2} µs/{unit} \
         server (CPU µs/{unit}: server {server_cpu:.2}, clients {client_cpu:.2}){}{label}",
        pass + 1,
        m.kind.name(),
        m.depth,
        m.ops_per_sec(),
        m.usec_per_op(),
        if m.exhausted { " (ran out of ids)" } else { "" },
    );
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let cfg = Config::from_env()?;
    let module = server::module_path("run `make bench` (it builds the release module)")?;
    let began = Instant::now();
    let mut results = report::Results::default();

    if cfg.runs("load") {
        let floor = server::floor_module_path();
        if floor.is_none() {
            eprintln!(
                "bench: no target/release/examples/libapifloor.so (cargo build --release \
                 --example apifloor): the API floor rows are not run"
            );
            results.floor_missing = true;
        }
        let server = Server::start_with(&module, floor.as_deref(), "load", &[])?;
        let mut con = server.connection()?;
        results.redis_version = server::redis_version(&mut con)?;
        let scripts = Scripts::load(&mut con)?;
        // The multi-limit rows need issue 19's commands; a module without them leaves the
        // rows "not run" instead of failing the whole bench.
        let has_multi = load::has_command(&mut con, "quota.mreserve")?
            && load::has_command(&mut con, "quota.msettle")?;
        if !has_multi {
            results.multi_missing = true;
            eprintln!("bench: the module has no QUOTA.MRESERVE / MSETTLE: their rows are not run");
        }
        let mut run = Run {
            server: &server,
            scripts: &scripts,
            threads: cfg.threads,
            duration: cfg.duration,
            prefill_per_thread: 0,
        };
        // Whole passes over the workloads, interleaved, so that a burst of outside load hits
        // different workloads in different passes; each keeps its best pass (least server time,
        // most throughput: outside load only ever adds time).
        for pass in 0..cfg.repeat {
            for kind in Kind::ALL {
                if (kind.needs_floor() && floor.is_none())
                    || (kind.needs_multi() && !has_multi)
                    || !cfg.runs_workload(kind)
                {
                    continue;
                }
                for depth in DEPTHS {
                    // Rollbacks need reservations made beforehand: enough for the run at the
                    // matching reserve workload's pace, with a margin.
                    let pace = match kind {
                        Kind::LuaRollback => results.ops_per_sec(Kind::LuaReserve, depth),
                        Kind::Rollback => results.ops_per_sec(Kind::Reserve, depth),
                        _ => None,
                    };
                    run.prefill_per_thread = pace.map_or(0, |ops| {
                        (ops * cfg.duration.as_secs_f64() * 2.0 / cfg.threads as f64) as usize
                            + 4 * depth
                    });
                    let m: Measure = load::measure(&run, kind, depth)?;
                    log_pass(pass, cfg.repeat, &m, "");
                    results.add(m);
                }
            }
        }
        // The throughput goal again, with the server on a CPU of its own (see `Pinned`).
        let pinned_kinds: Vec<Kind> = Kind::PINNED
            .into_iter()
            .filter(|&k| cfg.runs_workload(k))
            .collect();
        if !cfg.pin {
            results.pinned_skipped = Some("BENCH_PIN=0".into());
        } else if !pinned_kinds.is_empty() {
            match server::Pinned::new(&server) {
                Err(e) => results.pinned_skipped = Some(e.to_string()),
                Ok(pinned) => {
                    results.pinned_client_cpus = pinned.client_cpus;
                    for pass in 0..cfg.repeat {
                        for &kind in &pinned_kinds {
                            let m = load::measure(&run, kind, PINNED_DEPTH)?;
                            log_pass(pass, cfg.repeat, &m, " [server on its own CPU]");
                            load::add_best(&mut results.pinned, m);
                        }
                    }
                }
            }
        }
    }

    if cfg.runs("memory") {
        eprintln!(
            "bench: memory ({} items, {} window keys)…",
            cfg.mem_items, cfg.window_keys
        );
        results.memory = Some(memory::measure_memory(
            &module,
            cfg.mem_items,
            cfg.window_keys,
            cfg.window_rate,
        )?);
    }

    if cfg.runs("sweeper") {
        let hint = results.ops_per_sec(Kind::Reserve, 16).unwrap_or(60_000.0);
        // A storm (every reservation expires within the spread) at each effort, then the steady
        // case at the default effort: one in a hundred expires, among all the others pending.
        let mut scenarios: Vec<(usize, i64)> = cfg.sweep_efforts.iter().map(|&e| (1, e)).collect();
        scenarios.push((100, 1000));
        for (every, effort) in scenarios {
            eprintln!(
                "bench: sweeper ({} × {} pending, 1 in {every} expiring, sweep-effort {effort})…",
                cfg.sweep_keys, cfg.sweep_per_key
            );
            let r = memory::measure_sweeper(
                &module,
                cfg.sweep_keys,
                cfg.sweep_per_key,
                every,
                cfg.sweep_spread_ms,
                effort,
                hint,
            )?;
            eprintln!(
                "bench: sweeper: peak {} pending ({} expiring), max lag {} ms, drained {} ms after \
                 the last deadline",
                r.pending_peak,
                r.expiring,
                r.max_lag_ms,
                r.drain_after_last_ms
                    .map_or("(timed out)".into(), |d| d.to_string())
            );
            results.sweeper.push(r);
        }
    }

    if cfg.runs("complexity") {
        eprintln!(
            "bench: reads with an expired backlog ({:?} reservations)…",
            cfg.backlog_sizes
        );
        results.backlog = complexity::measure_expired_reads(&module, &cfg.backlog_sizes)?;
    }

    if results.redis_version.is_empty() {
        let server = Server::start(&module, "version", &[])?;
        results.redis_version = server::redis_version(&mut server.connection()?)?;
    }
    results.wall = began.elapsed();
    let text = report::render(&cfg, &results);
    println!("{text}");
    if let Some(path) = &cfg.out {
        report::write_doc(path, &text)?;
        eprintln!("bench: report written to {}", path.display());
    }
    Ok(())
}
