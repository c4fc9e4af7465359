//! `make demo` in small: the replay (examples/replay/) over the trace's first two minutes at 30×
//! (about 4 s), against its own server with the module under test. It must reconcile to the
//! token (the budgets' `used` equals what the clients settled, nothing left reserved or in
//! flight, the never-denied tenants not denied) and write its SVG report. With the exporter
//! built (`$QUOTA_EXPORT`, else `target/debug/quota-export`: `make test` builds it first, with
//! `cargo test -p quota-export`), it also exports the usage streams into SQLite and must pass
//! `quota-export reconcile` and match the clients' settled tokens in the database.

// The example's own code, so the test runs exactly what `make demo` runs (its `main` is unused).
#[allow(dead_code)]
#[path = "../examples/replay/main.rs"]
mod replay;

use std::path::{Path, PathBuf};

#[test]
fn a_short_replay_reconciles_and_writes_its_report() {
    let dir = std::env::temp_dir().join(format!("redis-quota-demo-test-{}", std::process::id()));
    let report = dir.join("report.svg");
    let db = dir.join("usage.sqlite");
    let export = match std::env::var_os("QUOTA_EXPORT").filter(|p| !p.is_empty()) {
        Some(bin) => Ok(PathBuf::from(bin)),
        None => {
            let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/debug/quota-export");
            if bin.is_file() {
                Ok(bin)
            } else {
                Err(format!(
                    "no {} (cargo build -p quota-export)",
                    bin.display()
                ))
            }
        }
    }
    .map(|bin| replay::export::Export {
        bin,
        db: db.clone(),
    });
    if let Err(why) = &export {
        eprintln!("demo_replay: the export part is skipped: {why}");
    }
    let exporting = export.is_ok();
    let config = replay::Config {
        speed: 30.0,
        first_token_ms: 500.0,
        token_ms: 30.0,
        minutes: Some(2.0),
        report: report.clone(),
        redis_url: None,
        export,
    };
    let finished = replay::run(config).expect("the replay runs");
    assert!(
        finished.reconciled,
        "the replay's reconciliation failed (see its output)"
    );
    // The module under test has the multi-key commands, and the first two minutes already
    // deny conv-2 for concurrency and conv-3 for its budget.
    assert_eq!(finished.mode, replay::quota::Mode::Multi);
    assert_eq!(finished.exported, exporting);
    if exporting {
        assert!(db.is_file(), "the export wrote {}", db.display());
    }
    let [concurrency, _rpm, _tpm, budget] = finished.denied;
    assert!(concurrency > 0 && budget > 0, "{:?}", finished.denied);
    let svg = std::fs::read_to_string(&report).expect("the report is written");
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    for tenant in [
        "conv-0",
        "conv-3",
        "code-0",
        "code-3",
        "tokens per minute",
        "CC-BY 4.0",
    ] {
        assert!(svg.contains(tenant), "the report names {tenant}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
