//! One usage stream entry as the module writes it (docs/usage-export.md), parsed and checked.
//! Anything else is malformed: the exporter skips it (acknowledged, never stored as usage),
//! logs it and counts it.

use redis::Value;

/// The fields every entry carries, in the order the module writes them.
pub const FIELDS: [&str; 8] = [
    "key",
    "event",
    "id",
    "held",
    "charged",
    "used",
    "period_start",
    "at",
];

/// A well-formed usage entry: one database row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The stream key it was read from.
    pub stream: String,
    /// The stream entry id (`<ms>-<seq>`): with `stream`, the row's unique key.
    pub entry_id: String,
    /// The budget key.
    pub key: String,
    /// `settle`, `late_settle`, `rollback`, `expire`, `charge`, `forced_charge`, `reset`,
    /// `adjust` (later module versions may add others: any lowercase word is kept).
    pub event: String,
    /// Reservation or charge id; empty where none applies.
    pub id: String,
    /// The reservation's amount; -1 where none applies.
    pub held: i64,
    /// What `used` grew by (0 for a rollback, an expiry, a reset).
    pub charged: i64,
    /// `used` after the event (for a reset: the closing `used`).
    pub used: i64,
    /// Start (unix ms) of the period the entry counts in; -1 without a period.
    pub period_start: i64,
    /// The master's time of the command (unix ms).
    pub at_ms: i64,
}

/// An entry that is not a usage entry, with why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    pub stream: String,
    pub entry_id: String,
    pub reason: String,
}

/// A raw stream entry: its id and its field/value pairs (`None`: the entry was deleted while
/// pending, e.g. trimmed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEntry {
    pub id: String,
    pub fields: Option<Vec<(Vec<u8>, Vec<u8>)>>,
}

/// Bytes of a string-like reply.
pub fn bytes_of(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        Value::Int(n) => Some(n.to_string().into_bytes()),
        Value::Okay => Some(b"OK".to_vec()),
        _ => None,
    }
}

/// A string-like reply as text (lossy).
pub fn text_of(v: &Value) -> Option<String> {
    bytes_of(v).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Parses the entries of one stream in an XREADGROUP / XRANGE / XAUTOCLAIM reply:
/// `[[id, [field, value, ...] | nil], ...]`. An element that is not shaped like an entry is
/// returned as an entry without fields only if it has an id; otherwise it is dropped and
/// reported in the second list.
pub fn parse_entries(v: &Value) -> (Vec<RawEntry>, Vec<String>) {
    let mut out = Vec::new();
    let mut bad = Vec::new();
    let Value::Array(items) = v else {
        if !matches!(v, Value::Nil) {
            bad.push(format!("not an entry list: {v:?}"));
        }
        return (out, bad);
    };
    for item in items {
        let Value::Array(parts) = item else {
            bad.push(format!("not an entry: {item:?}"));
            continue;
        };
        let Some(id) = parts.first().and_then(text_of) else {
            bad.push(format!("entry without id: {item:?}"));
            continue;
        };
        let fields = match parts.get(1) {
            Some(Value::Array(kv)) => {
                let mut pairs = Vec::with_capacity(kv.len() / 2);
                let mut it = kv.iter();
                while let Some(k) = it.next() {
                    let (Some(k), Some(v)) = (bytes_of(k), it.next().and_then(bytes_of)) else {
                        break;
                    };
                    pairs.push((k, v));
                }
                Some(pairs)
            }
            Some(Value::Map(kv)) => Some(
                kv.iter()
                    .filter_map(|(k, v)| Some((bytes_of(k)?, bytes_of(v)?)))
                    .collect(),
            ),
            _ => None,
        };
        out.push(RawEntry { id, fields });
    }
    (out, bad)
}

/// Checks one entry's fields: each of [`FIELDS`] exactly once (others are ignored), integers
/// where integers are due, an event that is a lowercase word.
pub fn parse_row(
    stream: &str,
    entry_id: &str,
    fields: &[(Vec<u8>, Vec<u8>)],
) -> Result<Row, Malformed> {
    let bad = |reason: String| Malformed {
        stream: stream.to_string(),
        entry_id: entry_id.to_string(),
        reason,
    };
    let mut values: [Option<&[u8]>; 8] = [None; 8];
    for (k, v) in fields {
        if let Some(i) = FIELDS.iter().position(|f| f.as_bytes() == k.as_slice()) {
            if values[i].is_some() {
                return Err(bad(format!("field {} repeated", FIELDS[i])));
            }
            values[i] = Some(v);
        }
    }
    let text = |i: usize| -> Result<String, Malformed> {
        values[i]
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .ok_or_else(|| bad(format!("field {} missing", FIELDS[i])))
    };
    let int = |i: usize| -> Result<i64, Malformed> {
        let t = text(i)?;
        t.parse::<i64>()
            .map_err(|_| bad(format!("field {} is not an integer: {t:?}", FIELDS[i])))
    };
    let key = text(0)?;
    let event = text(1)?;
    if event.is_empty() || !event.bytes().all(|c| c.is_ascii_lowercase() || c == b'_') {
        return Err(bad(format!("bad event {event:?}")));
    }
    let row = Row {
        stream: stream.to_string(),
        entry_id: entry_id.to_string(),
        key,
        event,
        id: text(2)?,
        held: int(3)?,
        charged: int(4)?,
        used: int(5)?,
        period_start: int(6)?,
        at_ms: int(7)?,
    };
    if row.key.is_empty() {
        return Err(bad("empty key".into()));
    }
    Ok(row)
}

/// A stream entry id `<ms>-<seq>` as a pair, for comparisons.
pub fn parse_stream_id(s: &str) -> Option<(u64, u64)> {
    let (ms, seq) = s.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    fn good() -> Vec<(&'static str, &'static str)> {
        vec![
            ("key", "{t}:b"),
            ("event", "settle"),
            ("id", "r1"),
            ("held", "10"),
            ("charged", "7"),
            ("used", "12"),
            ("period_start", "-1"),
            ("at", "1700000000000"),
        ]
    }

    #[test]
    fn a_module_entry_parses() {
        let row = parse_row("s", "1-0", &kv(&good())).unwrap();
        assert_eq!(row.key, "{t}:b");
        assert_eq!(
            (row.held, row.charged, row.used, row.period_start),
            (10, 7, 12, -1)
        );
        assert_eq!(row.at_ms, 1_700_000_000_000);
    }

    #[test]
    fn malformed_entries_say_why() {
        for (i, want) in [
            (0, "field key missing"),
            (4, "field charged missing"),
            (7, "field at missing"),
        ] {
            let mut f = good();
            f.remove(i);
            assert_eq!(parse_row("s", "1-0", &kv(&f)).unwrap_err().reason, want);
        }
        let mut f = good();
        f[4].1 = "seven";
        assert!(parse_row("s", "1-0", &kv(&f))
            .unwrap_err()
            .reason
            .contains("charged"));
        let mut f = good();
        f[1].1 = "Settle!";
        assert!(parse_row("s", "1-0", &kv(&f)).is_err());
        let mut f = good();
        f.push(("used", "3"));
        assert!(parse_row("s", "1-0", &kv(&f))
            .unwrap_err()
            .reason
            .contains("repeated"));
        let mut f = good();
        f[5].1 = "99999999999999999999";
        assert!(parse_row("s", "1-0", &kv(&f)).is_err());
    }

    #[test]
    fn odd_replies_never_panic() {
        let (e, bad) = parse_entries(&Value::Array(vec![
            Value::Int(3),
            Value::Array(vec![]),
            Value::Array(vec![Value::BulkString(b"1-0".to_vec()), Value::Nil]),
            Value::Array(vec![
                Value::BulkString(b"2-0".to_vec()),
                Value::Array(vec![Value::BulkString(b"key".to_vec())]),
            ]),
        ]));
        assert_eq!(bad.len(), 2);
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].fields, None);
        assert_eq!(e[1].fields, Some(vec![]));
    }

    #[test]
    fn stream_ids_compare_as_pairs() {
        assert!(parse_stream_id("10-0") > parse_stream_id("9-5"));
        assert_eq!(parse_stream_id("x"), None);
    }
}
