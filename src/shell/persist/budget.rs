//! Budget values (`rq-budget`): encoding versions and their decoders.

use bincode::Options;
use serde::{Deserialize, Serialize};

use super::{options, DecodeError};
use crate::core::book::{Book, Entry, Finished, Outcome, Reservation};
use crate::core::id::StreamId;
use crate::core::ledger::{Budget, Settings, UsageLog};
use crate::core::period::{Period, PeriodKind};
use crate::shell::args::check_id;
use crate::shell::config::MAX_ID_LENGTH_RANGE;

/// Encoding version of budget values written by this build.
/// - 1: ledger, pending reservations, finished ids.
/// - 2: adds the calendar period (kind, zone, anchor) and the current period's bounds.
/// - 3: adds the usage log (stream key, MAXLEN), if any.
pub const BUDGET_ENCVER: i32 = 3;

#[derive(Serialize, Deserialize)]
enum OutcomeV1 {
    Settled { actual: i64, late: bool },
    RolledBack { amount: i64 },
    Expired { amount: i64 },
    Charged { amount: i64 },
}

/// Encoding version 1 of a budget.
#[derive(Serialize, Deserialize)]
struct BudgetV1 {
    limit: i64,
    used: i64,
    reserved: i64,
    overdraft: i64,
    /// −1 = none.
    max_reserve: i64,
    default_ttl_ms: i64,
    overrun: i64,
    clock_ms: i64,
    last_id: (u64, u64),
    /// (id, amount, created_ms, deadline_ms), in id order.
    pending: Vec<(Vec<u8>, i64, i64, i64)>,
    /// (id, outcome, finished_ms), in id order.
    finished: Vec<(Vec<u8>, OutcomeV1, i64)>,
}

/// Encoding version 2: version 1 followed by the period.
#[derive(Serialize, Deserialize)]
struct BudgetV2 {
    v1: BudgetV1,
    period_kind: PeriodKind,
    tz: String,
    anchor_ms: Option<i64>,
    bounds: Option<(i64, i64)>,
}

/// Encoding version 3: version 2 followed by the usage log `(stream key, max_len)`.
#[derive(Serialize, Deserialize)]
struct BudgetV3 {
    v2: BudgetV2,
    usage: Option<(Vec<u8>, i64)>,
}

/// Encodes a budget at the current encoding version.
pub fn encode_budget(b: &Budget) -> Vec<u8> {
    let mut pending = Vec::new();
    let mut finished = Vec::new();
    for (id, entry) in b.book.entries() {
        match entry {
            Entry::Pending(r) => pending.push((id.to_vec(), r.amount, r.created_ms, r.deadline_ms)),
            Entry::Finished(f) => {
                let o = match f.outcome {
                    Outcome::Settled { actual, late } => OutcomeV1::Settled { actual, late },
                    Outcome::RolledBack { amount } => OutcomeV1::RolledBack { amount },
                    Outcome::Expired { amount } => OutcomeV1::Expired { amount },
                    Outcome::Charged { amount } => OutcomeV1::Charged { amount },
                };
                finished.push((id.to_vec(), o, f.finished_ms));
            }
        }
    }
    let v1 = BudgetV1 {
        limit: b.settings.limit,
        used: b.used,
        reserved: b.reserved,
        overdraft: b.settings.overdraft,
        max_reserve: b.settings.max_reserve.unwrap_or(-1),
        default_ttl_ms: b.settings.default_ttl_ms,
        overrun: b.overrun,
        clock_ms: b.clock_ms,
        last_id: (b.last_id.ms, b.last_id.seq),
        pending,
        finished,
    };
    let v = BudgetV3 {
        v2: BudgetV2 {
            v1,
            period_kind: b.period.kind,
            tz: b.period.tz.clone(),
            anchor_ms: b.period.anchor_ms,
            bounds: b.period_bounds,
        },
        usage: b.usage.as_ref().map(|u| (u.stream.clone(), u.max_len)),
    };
    // Serializing plain integers and byte vectors into a Vec cannot fail under the 1 GiB limit
    // unless the value itself is larger; an empty buffer then fails loudly on load instead.
    options().serialize(&v).unwrap_or_default()
}

/// Decodes a budget written at encoding version `encver`.
pub fn decode_budget(encver: i32, bytes: &[u8]) -> Result<Budget, DecodeError> {
    let malformed = DecodeError::from_bincode;
    match encver {
        1 => from_v1(options().deserialize(bytes).map_err(malformed)?, None, None),
        2 => from_v2(options().deserialize(bytes).map_err(malformed)?, None),
        3 => {
            let v3: BudgetV3 = options().deserialize(bytes).map_err(malformed)?;
            let usage = v3
                .usage
                .map(|(stream, max_len)| UsageLog { stream, max_len });
            from_v2(v3.v2, usage)
        }
        v => Err(DecodeError::UnknownVersion(v)),
    }
}

fn from_v2(v2: BudgetV2, usage: Option<UsageLog>) -> Result<Budget, DecodeError> {
    let period = Period::new(v2.period_kind, v2.tz.as_bytes(), v2.anchor_ms)
        .map_err(DecodeError::invalid)?;
    from_v1(v2.v1, Some((period, v2.bounds)), usage)
}

const BAD_ID: &str = "an id is empty, longer than 65536 bytes or repeated";

/// Could a command name this id (1..=65536 bytes, the hard cap of `quota.max-id-length`)? No
/// server ever stored another: one in a payload is forged, and would be stuck.
fn nameable(id: &[u8]) -> bool {
    check_id(id, MAX_ID_LENGTH_RANGE.1).is_ok()
}

fn from_v1(
    v: BudgetV1,
    period: Option<(Period, Option<(i64, i64)>)>,
    usage: Option<UsageLog>,
) -> Result<Budget, DecodeError> {
    let (period, period_bounds) = period.unwrap_or_else(|| (Period::none(), None));
    let mut book = Book::default();
    for (id, amount, created_ms, deadline_ms) in v.pending {
        if !nameable(&id) || book.get(&id).is_some() {
            return Err(DecodeError::Invalid(BAD_ID.into()));
        }
        book.put(
            &id,
            Entry::Pending(Reservation {
                amount,
                created_ms,
                deadline_ms,
            }),
        );
    }
    for (id, o, finished_ms) in v.finished {
        if !nameable(&id) || book.get(&id).is_some() {
            return Err(DecodeError::Invalid(BAD_ID.into()));
        }
        let outcome = match o {
            OutcomeV1::Settled { actual, late } => Outcome::Settled { actual, late },
            OutcomeV1::RolledBack { amount } => Outcome::RolledBack { amount },
            OutcomeV1::Expired { amount } => Outcome::Expired { amount },
            OutcomeV1::Charged { amount } => Outcome::Charged { amount },
        };
        book.put(
            &id,
            Entry::Finished(Finished {
                outcome,
                finished_ms,
            }),
        );
    }
    let budget = Budget {
        settings: Settings {
            limit: v.limit,
            overdraft: v.overdraft,
            max_reserve: match v.max_reserve {
                -1 => None,
                m if m >= 0 => Some(m),
                // Only -1 means "no cap": another negative was never written.
                _ => return Err(DecodeError::Invalid("MAXRESERVE below -1".into())),
            },
            default_ttl_ms: v.default_ttl_ms,
        },
        used: v.used,
        reserved: v.reserved,
        overrun: v.overrun,
        clock_ms: v.clock_ms,
        last_id: StreamId {
            ms: v.last_id.0,
            seq: v.last_id.1,
        },
        book,
        period,
        period_bounds,
        usage,
        index_tag: Default::default(),
    };
    budget.check_invariants().map_err(DecodeError::invalid)?;
    Ok(budget)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ledger::{Effect, Policy};

    fn sample() -> Budget {
        let s = Settings {
            limit: 1000,
            overdraft: 5,
            max_reserve: Some(600),
            default_ttl_ms: 50,
        };
        let mut b = Budget::new(s, 1);
        let p = Policy::default();
        for (t, amount) in [(10, 100), (11, 200), (12, 300)] {
            let plan = b.plan_reserve(t, &p, amount, None, None).unwrap();
            for e in &plan.effects {
                b.apply(t, e).unwrap();
            }
        }
        let plan = b.plan_settle(20, &p, b"10-0", 90).unwrap();
        for e in &plan.effects {
            b.apply(20, e).unwrap();
        }
        b.apply(
            21,
            &Effect::Charge {
                amount: 7,
                overrun: 0,
                id: Some(b"c1"[..].into()),
                forced: false,
            },
        )
        .unwrap();
        b.apply(
            22,
            &Effect::Usage {
                log: Some(UsageLog {
                    stream: b"{t}:usage".to_vec(),
                    max_len: 1000,
                }),
            },
        )
        .unwrap();
        b
    }

    #[test]
    fn round_trip_is_exact() {
        let b = sample();
        let bytes = encode_budget(&b);
        let back = decode_budget(BUDGET_ENCVER, &bytes).unwrap();
        assert_eq!(back, b);
        assert_eq!(encode_budget(&back), bytes);
    }

    #[test]
    fn corrupt_payloads_are_refused_not_panicking() {
        let bytes = encode_budget(&sample());
        for cut in 0..bytes.len() {
            assert!(
                decode_budget(BUDGET_ENCVER, &bytes[..cut]).is_err(),
                "truncated at {cut}"
            );
        }
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                // Must not panic; either refused or a value that passes the invariants.
                if let Ok(v) = decode_budget(BUDGET_ENCVER, &b) {
                    v.check_invariants().unwrap();
                }
            }
        }
        assert_eq!(
            decode_budget(BUDGET_ENCVER + 1, &bytes).unwrap_err(),
            DecodeError::UnknownVersion(BUDGET_ENCVER + 1)
        );
        // A huge length prefix must not allocate it.
        let mut huge = vec![0u8; 9];
        huge.extend([0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
        assert!(decode_budget(BUDGET_ENCVER, &huge).is_err());
    }

    #[test]
    fn ids_no_command_could_name_are_refused() {
        let pending = |id: Vec<u8>| {
            let mut b = Budget::new(sample().settings, 1);
            b.book.put(
                &id,
                Entry::Pending(Reservation {
                    amount: 1,
                    created_ms: 1,
                    deadline_ms: 2,
                }),
            );
            b.reserved = 1;
            decode_budget(BUDGET_ENCVER, &encode_budget(&b))
        };
        assert!(pending(vec![b'x'; 65_536]).is_ok());
        assert_eq!(
            pending(vec![b'x'; 65_537]).unwrap_err(),
            DecodeError::Invalid(BAD_ID.into())
        );
    }

    #[test]
    fn an_inconsistent_value_is_named_without_a_second_error_code() {
        let mut b = sample();
        b.reserved = b.reserved.checked_add(1).unwrap();
        let err = decode_budget(BUDGET_ENCVER, &encode_budget(&b)).unwrap_err();
        // QUOTA.LOAD replies `ERR QUOTA.LOAD: <this>`: one code, at the front.
        assert_eq!(
            err.to_string(),
            "inconsistent payload: corrupt budget value: reserved differs from the pending sum"
        );
        let mut v: BudgetV3 = options().deserialize(&encode_budget(&sample())).unwrap();
        v.v2.v1.max_reserve = -7;
        let err = decode_budget(BUDGET_ENCVER, &options().serialize(&v).unwrap()).unwrap_err();
        assert_eq!(err, DecodeError::Invalid("MAXRESERVE below -1".into()));
        let mut b = sample();
        b.period_bounds = Some((5, 5));
        let err = decode_budget(BUDGET_ENCVER, &encode_budget(&b)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "inconsistent payload: corrupt budget value: empty period"
        );
    }
}
