//! The Azure LLM inference trace 2023: both CSVs merged into trace order, with what the replay
//! derives from a row (tenant, max_tokens, reservation, real usage).

use std::path::Path;

use super::{Result, TENANTS_PER_SERVICE};

/// The trace, shipped with the example (never read from outside the repository).
const DATA_DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/data/azure-llm-inference-2023"
);
/// (service name, file) in tie-break order.
pub const SERVICES: [(&str, &str); 2] = [
    ("conv", "AzureLLMInferenceTrace_conv.csv"),
    ("code", "AzureLLMInferenceTrace_code.csv"),
];
const HEADER: &str = "TIMESTAMP,ContextTokens,GeneratedTokens";

/// One row of the trace.
pub struct Request {
    /// As in the file: `YYYY-MM-DD HH:MM:SS.fffffff`.
    pub timestamp: String,
    /// µs after the trace's first request.
    pub at_us: u64,
    /// Index into [`SERVICES`].
    pub service: usize,
    /// 0-based row in its file, header excluded.
    pub row: usize,
    pub context: u64,
    pub generated: u64,
}

impl Request {
    /// Row `r` of service `s` belongs to tenant `s-(r mod 4)`: index `s × 4 + r mod 4`.
    pub fn tenant(&self) -> usize {
        self.service * TENANTS_PER_SERVICE + self.row % TENANTS_PER_SERVICE
    }

    /// Derived completion cap: the next power of two at or above GeneratedTokens, at least 16.
    pub fn max_tokens(&self) -> u64 {
        self.generated.next_power_of_two().max(16)
    }

    /// What the client reserves: ContextTokens + ceil(max_tokens × 1.2).
    pub fn reservation(&self) -> u64 {
        self.context + (self.max_tokens() * 6).div_ceil(5)
    }

    /// What the request really used.
    pub fn actual(&self) -> u64 {
        self.context + self.generated
    }

    /// The id of a tenant that sends its own: `<service>-<row>`.
    pub fn own_id(&self) -> String {
        format!("{}-{}", SERVICES[self.service].0, self.row)
    }
}

/// Reads both CSVs and merges them into trace order.
pub fn load() -> Result<Vec<Request>> {
    let dir = Path::new(DATA_DIR);
    let mut all = Vec::new();
    for (service, (_, file)) in SERVICES.iter().enumerate() {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, h)) if h.trim() == HEADER => {}
            other => {
                return Err(format!(
                    "{}: expected header {HEADER:?}, found {:?}",
                    path.display(),
                    other.map(|(_, h)| h)
                )
                .into())
            }
        }
        let mut row = 0;
        for (n, line) in lines {
            if line.trim().is_empty() {
                continue;
            }
            let bad = |what: &str| format!("{}:{}: {what}: {line:?}", path.display(), n + 1);
            let fields: Vec<&str> = line.trim().split(',').collect();
            let [timestamp, context, generated] = fields[..] else {
                return Err(bad("expected 3 fields").into());
            };
            let context = context
                .parse()
                .map_err(|_| bad("ContextTokens is not a non-negative integer"))?;
            let generated = generated
                .parse()
                .map_err(|_| bad("GeneratedTokens is not a non-negative integer"))?;
            all.push((
                micros(timestamp).ok_or_else(|| bad("TIMESTAMP is not YYYY-MM-DD HH:MM:SS.f"))?,
                Request {
                    timestamp: timestamp.to_string(),
                    at_us: 0,
                    service,
                    row,
                    context,
                    generated,
                },
            ));
            row += 1;
        }
    }
    all.sort_by_key(|(t, r)| (*t, r.service, r.row));
    let first = all.first().map_or(0, |(t, _)| *t);
    Ok(all
        .into_iter()
        .map(|(t, mut r)| {
            r.at_us = u64::try_from(t - first).unwrap_or(0);
            r
        })
        .collect())
}

/// `YYYY-MM-DD HH:MM:SS[.fraction]` as µs since the Unix epoch (UTC; the trace names no zone).
fn micros(timestamp: &str) -> Option<i64> {
    let (date, time) = timestamp.trim().split_once(' ')?;
    let (time, fraction) = time.split_once('.').unwrap_or((time, ""));
    let at: jiff::civil::DateTime = format!("{date}T{time}").parse().ok()?;
    let seconds = jiff::tz::TimeZone::UTC.to_timestamp(at).ok()?.as_second();
    // The fraction's first six digits (the files have seven: 100 ns).
    if !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let micros: i64 = format!("{fraction:0<6}")[..6].parse().ok()?;
    Some(seconds * 1_000_000 + micros)
}
