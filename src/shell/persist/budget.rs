//! Budget values (`rq-budget`): encoding versions and their decoders.

use bincode::Options;
use serde::{Deserialize, Serialize};

use super::{options, DecodeError};
use crate::core::book::{Book, Entry, Finished, Outcome, Reservation};
use crate::core::id::StreamId;
use crate::core::ledger::{Budget, OnExpire, Settings, UsageLog};
use crate::core::period::{Period, PeriodKind};
use crate::shell::args::check_id;
use crate::shell::config::MAX_ID_LENGTH_RANGE;

/// Encoding version of budget values written by this build.
/// - 1: ledger, pending reservations, finished ids.
/// - 2: adds the calendar period (kind, zone, anchor) and the current period's bounds.
/// - 3: adds the expiry policy (ONEXPIRE), the UNIT, each reservation's last heartbeat and
///   each expiry's charge.
/// - 4: adds the usage log (stream key, MAXLEN), if any.
pub const BUDGET_ENCVER: i32 = 4;

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

/// Encoding version 3: version 2 followed by what issue 22 added.
#[derive(Serialize, Deserialize)]
struct BudgetV3 {
    v2: BudgetV2,
    /// 0 RELEASE, 1 CHARGE, 2 ELAPSED.
    on_expire: u8,
    /// The UNIT in ms; `None`: plain units.
    unit_ms: Option<i64>,
    /// Each pending reservation's last heartbeat minus its start (0: none), in `pending` order
    /// (one byte each without heartbeats).
    heartbeats: Vec<i64>,
    /// Each finished id's expiry charge (0 for every other outcome), in `finished` order.
    charges: Vec<i64>,
}

/// Encoding version 4: version 3 followed by the usage log `(stream key, max_len)`.
#[derive(Serialize, Deserialize)]
struct BudgetV4 {
    v3: BudgetV3,
    usage: Option<(Vec<u8>, i64)>,
}

/// What version 3 adds to a version-2 value.
struct V3Extra {
    on_expire: OnExpire,
    unit_ms: Option<i64>,
    heartbeats: Vec<i64>,
    charges: Vec<i64>,
}

fn on_expire_code(p: OnExpire) -> u8 {
    match p {
        OnExpire::Release => 0,
        OnExpire::Charge => 1,
        OnExpire::Elapsed => 2,
    }
}

/// Encodes a budget at the current encoding version.
pub fn encode_budget(b: &Budget) -> Vec<u8> {
    let mut pending = Vec::new();
    let mut finished = Vec::new();
    let (mut heartbeats, mut charges) = (Vec::new(), Vec::new());
    for (id, entry) in b.book.entries() {
        match entry {
            Entry::Pending(r) => {
                pending.push((id.to_vec(), r.amount, r.created_ms, r.deadline_ms));
                // An invariant: heartbeat >= start.
                heartbeats.push(r.heartbeat_ms.saturating_sub(r.created_ms));
            }
            Entry::Finished(f) => {
                let (o, charge) = match f.outcome {
                    Outcome::Settled { actual, late } => (OutcomeV1::Settled { actual, late }, 0),
                    Outcome::RolledBack { amount } => (OutcomeV1::RolledBack { amount }, 0),
                    Outcome::Expired { amount, charged } => {
                        (OutcomeV1::Expired { amount }, charged)
                    }
                    Outcome::Charged { amount } => (OutcomeV1::Charged { amount }, 0),
                };
                finished.push((id.to_vec(), o, f.finished_ms));
                charges.push(charge);
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
    let v2 = BudgetV2 {
        v1,
        period_kind: b.period.kind,
        tz: b.period.tz.clone(),
        anchor_ms: b.period.anchor_ms,
        bounds: b.period_bounds,
    };
    let v = BudgetV4 {
        v3: BudgetV3 {
            v2,
            on_expire: on_expire_code(b.settings.on_expire),
            unit_ms: b.settings.unit_ms,
            heartbeats,
            charges,
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
        3 => from_v3(options().deserialize(bytes).map_err(malformed)?, None),
        4 => {
            let v4: BudgetV4 = options().deserialize(bytes).map_err(malformed)?;
            let usage = v4
                .usage
                .map(|(stream, max_len)| UsageLog { stream, max_len });
            from_v3(v4.v3, usage)
        }
        v => Err(DecodeError::UnknownVersion(v)),
    }
}

fn from_v3(v3: BudgetV3, usage: Option<UsageLog>) -> Result<Budget, DecodeError> {
    {
        {
            let on_expire = match v3.on_expire {
                0 => OnExpire::Release,
                1 => OnExpire::Charge,
                2 => OnExpire::Elapsed,
                _ => return Err(DecodeError::Invalid("unknown ONEXPIRE policy".into())),
            };
            let extra = V3Extra {
                on_expire,
                unit_ms: v3.unit_ms,
                heartbeats: v3.heartbeats,
                charges: v3.charges,
            };
            let mut b = from_v2(v3.v2, Some(extra))?;
            b.usage = usage;
            b.check_invariants().map_err(DecodeError::invalid)?;
            Ok(b)
        }
    }
}

const BAD_ID: &str = "an id is empty, longer than 65536 bytes or repeated";

/// Could a command name this id (1..=65536 bytes, the hard cap of `quota.max-id-length`)? No
/// server ever stored another: one in a payload is forged, and would be stuck.
fn nameable(id: &[u8]) -> bool {
    check_id(id, MAX_ID_LENGTH_RANGE.1).is_ok()
}

fn from_v2(v2: BudgetV2, extra: Option<V3Extra>) -> Result<Budget, DecodeError> {
    let period = Period::new(v2.period_kind, v2.tz.as_bytes(), v2.anchor_ms)
        .map_err(DecodeError::invalid)?;
    from_v1(v2.v1, Some((period, v2.bounds)), extra)
}

fn from_v1(
    v: BudgetV1,
    period: Option<(Period, Option<(i64, i64)>)>,
    extra: Option<V3Extra>,
) -> Result<Budget, DecodeError> {
    let (period, period_bounds) = period.unwrap_or_else(|| (Period::none(), None));
    let (on_expire, unit_ms, heartbeats, charges) = match extra {
        Some(x) => (x.on_expire, x.unit_ms, Some(x.heartbeats), Some(x.charges)),
        None => (OnExpire::Release, None, None, None),
    };
    let counts_differ = || DecodeError::Invalid("per-entry lists differ in length".into());
    if heartbeats
        .as_ref()
        .is_some_and(|h| h.len() != v.pending.len())
        || charges
            .as_ref()
            .is_some_and(|c| c.len() != v.finished.len())
    {
        return Err(counts_differ());
    }
    let mut book = Book::default();
    book.set_unit(unit_ms);
    for (i, (id, amount, created_ms, deadline_ms)) in v.pending.into_iter().enumerate() {
        if !nameable(&id) || book.get(&id).is_some() {
            return Err(DecodeError::Invalid(BAD_ID.into()));
        }
        let since = heartbeats
            .as_ref()
            .and_then(|h| h.get(i).copied())
            .unwrap_or(0);
        let heartbeat_ms = created_ms
            .checked_add(since)
            .ok_or_else(|| DecodeError::Invalid("heartbeat out of range".into()))?;
        book.put(
            &id,
            Entry::Pending(Reservation {
                amount,
                created_ms,
                deadline_ms,
                heartbeat_ms,
            }),
        );
    }
    for (i, (id, o, finished_ms)) in v.finished.into_iter().enumerate() {
        if !nameable(&id) || book.get(&id).is_some() {
            return Err(DecodeError::Invalid(BAD_ID.into()));
        }
        let charge = charges
            .as_ref()
            .and_then(|c| c.get(i).copied())
            .unwrap_or(0);
        let outcome = match o {
            OutcomeV1::Expired { amount } => Outcome::Expired {
                amount,
                charged: charge,
            },
            // Only an expiry charges: anything else in the list was never written.
            _ if charge != 0 => {
                return Err(DecodeError::Invalid(
                    "a charge on an id that did not expire".into(),
                ))
            }
            OutcomeV1::Settled { actual, late } => Outcome::Settled { actual, late },
            OutcomeV1::RolledBack { amount } => Outcome::RolledBack { amount },
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
            on_expire,
            unit_ms,
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
        usage: None,
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
            on_expire: OnExpire::Elapsed,
            unit_ms: Some(1000),
            ..Settings::plain(1000, 5, Some(600), 50)
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
        // A heartbeat, an expiry charged by ELAPSED, one released for nothing (no heartbeat),
        // and a pending reservation with a heartbeat.
        fn run(b: &mut Budget, t: i64, plan: Vec<Effect>) {
            for e in &plan {
                b.apply(t, e).unwrap();
            }
        }
        let extend = b.plan_extend(30, &p, b"11-0", 50).unwrap().effects.to_vec();
        run(&mut b, 30, extend);
        let reserve = b
            .plan_reserve(31, &p, 5, None, None)
            .unwrap()
            .effects
            .to_vec();
        run(&mut b, 31, reserve);
        let extend = b
            .plan_extend(40, &p, b"31-0", 100)
            .unwrap()
            .effects
            .to_vec();
        run(&mut b, 40, extend);
        let sweep = b.plan_sweep(90, p.keep_ms, 10).to_vec();
        assert_eq!(sweep.len(), 2);
        run(&mut b, 90, sweep);
        assert!(b.book.entries().any(|(_, e)| matches!(
            e,
            Entry::Finished(Finished {
                outcome: Outcome::Expired { charged: 1, .. },
                ..
            })
        )));
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
            b.book.put(&id, Entry::Pending(Reservation::new(1, 1, 2)));
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
        let mut v: BudgetV4 = options().deserialize(&encode_budget(&sample())).unwrap();
        v.v3.v2.v1.max_reserve = -7;
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
