//! The replay's usage export (docs/usage-export.md): `quota-export run` as a child process
//! during the replay, moving the token budgets' usage streams into a SQLite file; afterwards
//! `quota-export run --once` to catch up and `quota-export reconcile` to compare the database
//! with the budgets. The replay then checks the database's sums against what the clients
//! settled: trace, Redis and database agree to the token.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::Result;

/// The consumer name of every `quota-export run` of the demo: the `--once` run after the
/// replay first takes back what the stopped background run left pending.
const CONSUMER: &str = "replay-demo";

/// Where the export goes.
#[derive(Clone, Debug)]
pub struct Export {
    /// The `quota-export` binary.
    pub bin: PathBuf,
    /// The SQLite file it writes (removed, with its journal files, at the start).
    pub db: PathBuf,
}

impl Export {
    /// `$QUOTA_EXPORT` (which must exist), else `target/release/quota-export` if built; the
    /// database is `$EXPORT_DB`, else `target/demo-usage.sqlite`. `Err(reason)` inside the
    /// `Ok`: no binary, the export is skipped (the replay says why).
    pub fn from_env() -> Result<std::result::Result<Export, String>> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let db = match std::env::var_os("EXPORT_DB") {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => root.join("target/demo-usage.sqlite"),
        };
        let bin = match std::env::var_os("QUOTA_EXPORT") {
            Some(p) if !p.is_empty() => {
                let p = PathBuf::from(p);
                if !p.is_file() {
                    return Err(format!(
                        "QUOTA_EXPORT={}: no such file (build it with \
                         `cargo build --release -p quota-export`)",
                        p.display()
                    )
                    .into());
                }
                p
            }
            _ => {
                let p = root.join("target/release/quota-export");
                if !p.is_file() {
                    return Ok(Err(format!(
                        "no quota-export binary at {} and QUOTA_EXPORT is not set \
                         (`make demo` builds it: `cargo build --release -p quota-export`)",
                        p.display()
                    )));
                }
                p
            }
        };
        Ok(Ok(Export { bin, db }))
    }

    /// Removes the database left by an earlier run and starts `quota-export run` on `streams`.
    pub fn start(&self, url: &str, streams: &[String]) -> Result<Running> {
        for suffix in ["", "-journal", "-wal", "-shm"] {
            let mut p = self.db.clone().into_os_string();
            p.push(suffix);
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("cannot remove {p:?}: {e}").into()),
            }
        }
        if let Some(dir) = self.db.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let log = self.log();
        let out =
            File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let child = self
            .command("run", url, streams)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .map_err(|e| format!("cannot run {} ({e})", self.bin.display()))?;
        Ok(Running {
            child: Some(child),
            log,
        })
    }

    /// The exporters' output (their progress, any error): next to the database.
    pub fn log(&self) -> PathBuf {
        let mut p = self.db.clone().into_os_string();
        p.push(".log");
        PathBuf::from(p)
    }

    fn command(&self, sub: &str, url: &str, streams: &[String]) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.arg(sub)
            .arg("--redis")
            .arg(url)
            .arg("--db")
            .arg(&self.db);
        if sub == "run" {
            cmd.arg("--consumer").arg(CONSUMER);
        }
        // reconcile too: its streams are checked even if none of their entries was stored.
        for s in streams {
            cmd.arg("--stream").arg(s);
        }
        cmd
    }

    /// After the replay: stops the background exporter (a kill loses nothing: its pending
    /// entries are taken back by the next run), catches up with `run --once`, then runs
    /// `reconcile` and prints its table. Returns reconcile's verdict and the database's sum of
    /// `charged` per budget key (the reconcile table's `db_charged` column).
    pub fn finish(
        &self,
        mut running: Running,
        url: &str,
        streams: &[String],
    ) -> Result<(bool, HashMap<String, u64>)> {
        let mut child = running.child.take().ok_or("the exporter was not started")?;
        if let Some(status) = child.try_wait()? {
            return Err(format!(
                "quota-export run exited during the replay ({status}); its log, {}:\n{}",
                running.log.display(),
                std::fs::read_to_string(&running.log).unwrap_or_default()
            )
            .into());
        }
        let _ = child.kill();
        let _ = child.wait();

        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(&running.log)?;
        let status = self
            .command("run", url, streams)
            .arg("--once")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .status()
            .map_err(|e| format!("cannot run {} ({e})", self.bin.display()))?;
        if !status.success() {
            return Err(format!(
                "quota-export run --once failed ({status}); its log, {}:\n{}",
                running.log.display(),
                std::fs::read_to_string(&running.log).unwrap_or_default()
            )
            .into());
        }

        let out = self
            .command("reconcile", url, streams)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {} ({e})", self.bin.display()))?;
        let table = String::from_utf8_lossy(&out.stdout);
        print!("{table}");
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        // Status 1 is a failed check (printed above); anything else is an error.
        if !out.status.success() && out.status.code() != Some(1) {
            return Err(format!("quota-export reconcile failed ({})", out.status).into());
        }
        // Rows: key, period_start, db_charged, used, diff, status (keys have no spaces here).
        let charged = table
            .lines()
            .skip(1)
            .filter_map(|line| {
                let cols: Vec<&str> = line.split_whitespace().collect();
                let sum = cols.get(2)?.parse::<u64>().ok()?;
                Some((cols.first()?.to_string(), sum))
            })
            .collect();
        Ok((out.status.success(), charged))
    }
}

/// The background `quota-export run`; killed if dropped before [`Export::finish`].
pub struct Running {
    child: Option<Child>,
    log: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
