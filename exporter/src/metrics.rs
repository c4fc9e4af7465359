//! Prometheus text exposition (format 0.0.4) of what the exporter stored, served on
//! `--metrics-addr` by a small HTTP server (tiny_http) on its own thread.
//!
//! Series (counters count rows newly stored by this process since it started):
//! - `quota_export_charged_units_total{key}`: units charged (sum of `charged`)
//! - `quota_export_events_total{key,event}`: entries by event
//! - `quota_export_used{key}`: `used` after the latest entry stored (a gauge)
//! - `quota_export_entries_total{stream}`, `quota_export_malformed_total{stream}`,
//!   `quota_export_lost_total{stream}` (entries deleted before this consumer could read them)
//! - `quota_export_lag{stream,group}`: entries in the stream the group has not read yet
//!   (`XINFO GROUPS` lag; -1 when Redis cannot tell)
//! - `quota_export_pending{stream,group}`: delivered but not yet acknowledged

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use crate::entry::Row;

/// The exporter's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    pub charged: BTreeMap<String, i64>,
    pub events: BTreeMap<(String, String), u64>,
    pub used: BTreeMap<String, i64>,
    pub entries: BTreeMap<String, u64>,
    pub malformed: BTreeMap<String, u64>,
    pub lost: BTreeMap<String, u64>,
    pub lag: BTreeMap<(String, String), i64>,
    pub pending: BTreeMap<(String, String), i64>,
}

/// Shared between the consumer and the HTTP thread.
pub type Shared = Arc<Mutex<Metrics>>;

impl Metrics {
    /// Counts rows newly stored.
    pub fn stored(&mut self, rows: &[&Row]) {
        for r in rows {
            *self.charged.entry(r.key.clone()).or_default() += r.charged;
            *self
                .events
                .entry((r.key.clone(), r.event.clone()))
                .or_default() += 1;
            if r.event != "reset" {
                self.used.insert(r.key.clone(), r.used);
            } else {
                self.used.insert(r.key.clone(), 0);
            }
            *self.entries.entry(r.stream.clone()).or_default() += 1;
        }
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, String)>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{{{labels}}} {value}");
            }
        };
        let key = |k: &str| format!("key=\"{}\"", esc(k));
        let stream = |s: &str| format!("stream=\"{}\"", esc(s));
        let group =
            |(s, g): &(String, String)| format!("stream=\"{}\",group=\"{}\"", esc(s), esc(g));
        family(
            "quota_export_charged_units_total",
            "counter",
            "Units charged per budget key (sum of the entries' charged), as exported.",
            self.charged
                .iter()
                .map(|(k, v)| (key(k), v.to_string()))
                .collect(),
        );
        family(
            "quota_export_events_total",
            "counter",
            "Usage entries exported per budget key and event.",
            self.events
                .iter()
                .map(|((k, e), v)| (format!("{},event=\"{}\"", key(k), esc(e)), v.to_string()))
                .collect(),
        );
        family(
            "quota_export_used",
            "gauge",
            "The budget's used after the latest exported entry.",
            self.used
                .iter()
                .map(|(k, v)| (key(k), v.to_string()))
                .collect(),
        );
        for (name, help, map) in [
            (
                "quota_export_entries_total",
                "Entries exported per stream.",
                &self.entries,
            ),
            (
                "quota_export_malformed_total",
                "Malformed entries skipped per stream.",
                &self.malformed,
            ),
            (
                "quota_export_lost_total",
                "Entries deleted (trimmed) before this consumer could export them.",
                &self.lost,
            ),
        ] {
            family(
                name,
                "counter",
                help,
                map.iter()
                    .map(|(s, v)| (stream(s), v.to_string()))
                    .collect(),
            );
        }
        for (name, help, map) in [
            (
                "quota_export_lag",
                "Entries the consumer group has not read yet (-1: unknown).",
                &self.lag,
            ),
            (
                "quota_export_pending",
                "Entries delivered to the group but not yet acknowledged.",
                &self.pending,
            ),
        ] {
            family(
                name,
                "gauge",
                help,
                map.iter().map(|(g, v)| (group(g), v.to_string())).collect(),
            );
        }
        out
    }
}

/// A label value escaped as the text format requires.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Serves `metrics` on `addr` (any path) from a background thread.
pub fn serve(addr: &str, metrics: Shared) -> Result<(), crate::Error> {
    let server =
        tiny_http::Server::http(addr).map_err(|e| format!("--metrics-addr {addr}: {e}"))?;
    std::thread::spawn(move || {
        for request in server.incoming_requests() {
            let body = metrics.lock().map(|m| m.render()).unwrap_or_default();
            let header = tiny_http::Header::from_bytes(
                &b"Content-Type"[..],
                &b"text/plain; version=0.0.4"[..],
            );
            let mut response = tiny_http::Response::from_string(body);
            if let Ok(h) = header {
                response.add_header(h);
            }
            let _ = request.respond(response);
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_come_with_their_samples() {
        let mut m = Metrics::default();
        let row = Row {
            stream: "s".into(),
            entry_id: "1-0".into(),
            key: "a\"b".into(),
            event: "settle".into(),
            id: "r".into(),
            held: 5,
            charged: 4,
            used: 4,
            period_start: -1,
            at_ms: 1,
        };
        m.stored(&[&row, &row]);
        let text = m.render();
        assert!(text.contains("quota_export_charged_units_total{key=\"a\\\"b\"} 8\n"));
        assert!(text.contains("quota_export_events_total{key=\"a\\\"b\",event=\"settle\"} 2\n"));
        let help = text.find("# TYPE quota_export_used gauge").unwrap();
        let sample = text.find("quota_export_used{").unwrap();
        assert!(help < sample);
    }
}
