//! Property fuzzing of everything that decodes untrusted bytes without a server:
//! - the RDB / RESTORE / `QUOTA.LOAD` decoders [`decode_budget`] and [`decode_window`], on random
//!   bytes and on mutations (truncation, bit flips, byte overwrites, deletions, duplications and
//!   inflated varint lengths) of valid encodings of random ledgers and windows built through the
//!   core API. Nothing may panic; anything accepted must pass its invariants, re-encode to a value
//!   that decodes to itself, and survive further commands (planned and applied at random times,
//!   including the i64 edges) without panicking or breaking an invariant;
//! - the effect decoder [`effects::decode`] (the tokens of `QUOTA.APPLY`) on random token lists,
//!   and the round trip `decode(write(effects)) == effects`.
//!
//! `make test` runs a few hundred cases per property; `make fuzz` runs the same properties with
//! `PROPTEST_CASES` large, for `FUZZ_SECONDS` (see the Makefile).

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{TestCaseError, TestRunner};

use redis_quota::core::book::Id;
use redis_quota::core::error::LedgerError;
use redis_quota::core::ledger::{
    Budget, Effect, OnExpire, Policy, ReserveReply, Settings, UsageLog,
};
use redis_quota::core::period::{Period, PeriodKind};
use redis_quota::core::window::{IdPlan, Window, WindowConfig, WindowEffect, WindowParams};
use redis_quota::shell::effects::{self, Logged};
use redis_quota::shell::persist::{
    decode_budget, decode_window, encode_budget, encode_window, BUDGET_ENCVER, WINDOW_ENCVER,
};
use redis_quota::shell::usage;

const T0: i64 = 1_700_000_000_000;

/// 256 cases per property unless `PROPTEST_CASES` says otherwise (`make fuzz`).
fn config() -> ProptestConfig {
    let mut c = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = 256;
    }
    // Failures print the minimal input; no regression file is written into the tree.
    c.failure_persistence = None;
    c
}

/// Number of properties below: `make fuzz` gives each an equal share of `FUZZ_SECONDS`.
const PROPERTIES: u32 = 8;

/// Runs `test` on values of `strategy` for `PROPTEST_CASES` cases (256 by default). With
/// `FUZZ_SECONDS` set (`make fuzz`) it runs them in batches of 250 and stops early once this
/// property's share of the time (`FUZZ_SECONDS / 8`) is used up. A failure is shrunk and
/// reported as by `proptest!`, never cut short by the time limit.
fn fuzz<S>(strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S: Strategy,
    S::Value: std::fmt::Debug,
{
    let base = config();
    let total = base.cases;
    let share = std::env::var("FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .map(|s| Duration::from_secs_f64(s / f64::from(PROPERTIES)));
    let batch = if share.is_some() {
        total.min(250)
    } else {
        total
    };
    let start = Instant::now();
    let mut done = 0;
    while done < total {
        // A fresh runner (and seed) per batch: a runner counts its cases across runs.
        let mut runner = TestRunner::new(ProptestConfig {
            cases: batch,
            ..base.clone()
        });
        if let Err(e) = runner.run(&strategy, &test) {
            panic!("{e}");
        }
        done += batch;
        if share.is_none_or(|s| start.elapsed() >= s) {
            break;
        }
    }
    if share.is_some() {
        eprintln!("{done} cases in {:.1?}", start.elapsed());
    }
}

// ---------------------------------------------------------------------------------------------
// Random ledgers and windows, built through the core API (plan, then apply every effect).
// ---------------------------------------------------------------------------------------------

/// Amounts and times from the interesting places: 0, small, powers of two, the i64 edge.
fn amount() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => 0i64..1_000,
        1 => Just(0i64),
        1 => (0u32..63).prop_map(|p| 1i64 << p),
        1 => Just(i64::MAX),
        1 => (0i64..1_000).prop_map(|d| i64::MAX - d),
    ]
}

#[derive(Debug, Clone)]
enum Op {
    Reserve {
        amount: i64,
        id: Option<u8>,
        ttl: Option<i64>,
    },
    Settle {
        pick: usize,
        actual: i64,
    },
    Rollback {
        pick: usize,
    },
    Extend {
        pick: usize,
        ttl: i64,
    },
    Charge {
        amount: i64,
        id: Option<u8>,
        force: bool,
    },
    Configure {
        limit: i64,
        used: Option<i64>,
    },
    Advance(i64),
}

fn op() -> impl Strategy<Value = Op> {
    let ttl = prop_oneof![1i64..100_000, Just(i64::MAX)];
    prop_oneof![
        4 => (amount(), proptest::option::of(any::<u8>()), proptest::option::of(ttl.clone()))
            .prop_map(|(amount, id, ttl)| Op::Reserve { amount, id, ttl }),
        3 => (any::<usize>(), amount()).prop_map(|(pick, actual)| Op::Settle { pick, actual }),
        1 => any::<usize>().prop_map(|pick| Op::Rollback { pick }),
        1 => (any::<usize>(), ttl).prop_map(|(pick, ttl)| Op::Extend { pick, ttl }),
        2 => (amount(), proptest::option::of(any::<u8>()), any::<bool>())
            .prop_map(|(amount, id, force)| Op::Charge { amount, id, force }),
        1 => (amount(), proptest::option::of(amount()))
            .prop_map(|(limit, used)| Op::Configure { limit, used }),
        2 => prop_oneof![0i64..1_000, 0i64..10_000_000].prop_map(Op::Advance),
    ]
}

fn period() -> impl Strategy<Value = Period> {
    let kind = prop_oneof![
        Just(PeriodKind::None),
        Just(PeriodKind::Minute),
        Just(PeriodKind::Hour),
        Just(PeriodKind::Day),
        Just(PeriodKind::Week),
        Just(PeriodKind::Month),
    ];
    let tz = prop_oneof![
        Just("UTC"),
        Just("Europe/Paris"),
        Just("America/New_York"),
        Just("+05:30"),
        Just("Australia/Lord_Howe"),
    ];
    (kind, tz, proptest::option::of(0i64..T0)).prop_map(|(kind, tz, anchor)| {
        let anchor = anchor.filter(|_| kind != PeriodKind::None);
        Period::new(kind, tz.as_bytes(), anchor).unwrap()
    })
}

/// A budget after a random history, and the time of its last command.
fn budget() -> impl Strategy<Value = (Budget, i64)> {
    (
        amount(),
        0i64..1_000,
        proptest::option::of(amount()),
        1i64..1_000_000,
        period(),
        0i64..100_000,
        proptest::collection::vec(op(), 0..40),
        proptest::option::of((
            proptest::collection::vec(any::<u8>(), 1..40),
            0i64..2_000_000,
        )),
        // Expiry policy and unit: heartbeats and expiry charges in the encoding.
        prop_oneof![
            Just((OnExpire::Release, None)),
            Just((OnExpire::Charge, Some(1000))),
            Just((OnExpire::Elapsed, Some(1))),
            Just((OnExpire::Elapsed, Some(60_000))),
        ],
    )
        .prop_map(
            |(
                limit,
                overdraft,
                max_reserve,
                ttl,
                period,
                keep_ms,
                ops,
                usage,
                (on_expire, unit_ms),
            )| {
                let settings = Settings {
                    limit,
                    overdraft,
                    max_reserve,
                    default_ttl_ms: ttl,
                    on_expire,
                    unit_ms,
                };
                let mut now = T0;
                let create = Budget::plan_create(now, settings, 0, period).unwrap();
                let mut b = Budget::new(settings, now);
                b.apply(now, &create).unwrap();
                // Sometimes a usage log (budget encoding 3's addition).
                if let Some((stream, max_len)) = usage {
                    b.apply(
                        now,
                        &Effect::Usage {
                            log: Some(UsageLog { stream, max_len }),
                        },
                    )
                    .unwrap();
                }
                let policy = Policy {
                    keep_ms,
                    max_pending: i64::MAX,
                };
                let mut ids: Vec<Vec<u8>> = Vec::new();
                for op in ops {
                    run_op(&mut b, &mut now, &policy, &mut ids, &op)
                        .expect("a planned effect applies");
                }
                (b, now)
            },
        )
}

/// Plans `op` at `now` and applies the planned effects in order, stopping at the first one
/// refused, as the server does (errors and denials plan nothing).
fn run_op(
    b: &mut Budget,
    now: &mut i64,
    policy: &Policy,
    ids: &mut Vec<Vec<u8>>,
    op: &Op,
) -> Result<(), LedgerError> {
    let t = b.now(*now);
    let custom = |n: &u8| format!("id-{n}").into_bytes();
    let pick = |i: &usize| {
        if ids.is_empty() {
            b"none".to_vec()
        } else {
            ids[i % ids.len()].clone()
        }
    };
    let effects = match op {
        Op::Reserve { amount, id, ttl } => {
            let id = id.as_ref().map(custom);
            b.plan_reserve(t, policy, *amount, id.as_deref(), *ttl)
                .ok()
                .map(|p| {
                    if let ReserveReply::Granted { id } = &p.reply {
                        ids.push(id.to_vec());
                    }
                    p.effects
                })
        }
        Op::Settle { pick: i, actual } => b
            .plan_settle(t, policy, &pick(i), *actual)
            .ok()
            .map(|p| p.effects),
        Op::Rollback { pick: i } => b.plan_rollback(t, policy, &pick(i)).ok().map(|p| p.effects),
        Op::Extend { pick: i, ttl } => b
            .plan_extend(t, policy, &pick(i), *ttl)
            .ok()
            .map(|p| p.effects),
        Op::Charge { amount, id, force } => {
            let id = id.as_ref().map(custom);
            b.plan_charge(t, policy, *amount, id.as_deref(), *force)
                .ok()
                .map(|p| p.effects)
        }
        Op::Configure { limit, used } => {
            let s = Settings {
                limit: *limit,
                ..*b.settings()
            };
            b.plan_configure(t, policy, s, *used, None)
                .ok()
                .map(|p| p.effects)
        }
        Op::Advance(ms) => {
            *now = now.saturating_add(*ms);
            None
        }
    };
    for e in effects.unwrap_or_default() {
        b.apply(t, &e)?;
    }
    Ok(())
}

/// Valid window parameters (what gets recorded), edges included: the precision is derived from
/// a bucket count so that `ceil(window / precision) <= 4096` always holds.
fn window_params() -> impl Strategy<Value = WindowParams> {
    (
        amount(),
        prop_oneof![1i64..100_000, Just(i64::MAX), 1i64..10],
        prop_oneof![0i64..100, amount()],
        prop_oneof![1i64..100, Just(1i64), Just(60i64), Just(4096i64)],
    )
        .prop_map(|(limit, window, cost, buckets)| {
            let precision = window / buckets + i64::from(window % buckets != 0);
            WindowParams::parse(limit, window, Some(cost), Some(precision)).unwrap()
        })
}

/// A window after a first recorded call and a random series of further calls (each recorded
/// if admitted); it may have emptied again if time moved past its horizon.
fn window() -> impl Strategy<Value = Window> {
    (
        window_params(),
        proptest::collection::vec((window_params(), 0i64..100_000), 0..30),
        // Issue 19: sometimes a stored configuration and the ids of multi-key reservations
        // (counted at a time step, some settled), so encoding 2's extras are fuzzed too.
        proptest::option::of((
            window_params(),
            proptest::collection::vec((0i64..1000, 0i64..50, 0i64..100), 0..8),
        )),
    )
        .prop_map(|(first, calls, extras)| {
            let mut now = T0;
            let mut w = Window::new(&first, now);
            w.record(&first, now).expect("a first call records");
            for (p, dt) in calls {
                now = now.saturating_add(dt);
                // An admitted call may still be refused with an overflow when the costs held over
                // the horizon (longer than this window) would pass i64::MAX: nothing changes then.
                if w.check(&p, now).is_ok_and(|d| d.allowed) {
                    let _ = w.record(&p, now);
                }
            }
            if let Some((p, ids)) = extras {
                let cfg = WindowConfig::parse(p.limit, p.window_ms, Some(p.precision_ms)).unwrap();
                let _ = w.apply(now, &WindowEffect::Configure(cfg));
                for (i, (dt, cost, actual)) in ids.into_iter().enumerate() {
                    now = now.saturating_add(dt);
                    let id: redis_quota::core::book::Id = format!("id{i}").as_bytes().into();
                    let count = WindowEffect::Count {
                        window_ms: cfg.window_ms,
                        precision_ms: cfg.precision_ms,
                        cost,
                        id: Some(id.clone()),
                    };
                    if w.apply(now, &count).is_ok() && i % 2 == 0 {
                        let _ = w.apply(now, &WindowEffect::Settle { id, actual });
                    }
                }
            }
            w.validate().unwrap();
            w
        })
}

// ---------------------------------------------------------------------------------------------
// Mutations of valid encodings.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Mutation {
    Truncate(Index),
    FlipBit(Index, u8),
    SetByte(Index, u8),
    /// Inserts a varint length marker (0xfb u16, 0xfc u32, 0xfd u64) followed by a huge value,
    /// or overwrites the byte at the index with one: the next length read is inflated.
    InflateLength(Index, u8, u64, bool),
    Delete(Index, usize),
    Duplicate(Index, usize),
    Append(Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let huge = prop_oneof![
        Just(u64::MAX),
        Just(i64::MAX as u64),
        Just(1u64 << 32),
        Just(u64::from(u32::MAX)),
        Just(1u64 << 30),
        any::<u64>(),
    ];
    prop_oneof![
        2 => any::<Index>().prop_map(Mutation::Truncate),
        4 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| Mutation::FlipBit(i, b)),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, v)| Mutation::SetByte(i, v)),
        3 => (any::<Index>(), 0xfbu8..=0xfd, huge, any::<bool>())
            .prop_map(|(i, m, v, ins)| Mutation::InflateLength(i, m, v, ins)),
        1 => (any::<Index>(), 1usize..16).prop_map(|(i, n)| Mutation::Delete(i, n)),
        1 => (any::<Index>(), 1usize..16).prop_map(|(i, n)| Mutation::Duplicate(i, n)),
        1 => proptest::collection::vec(any::<u8>(), 1..8).prop_map(Mutation::Append),
    ]
}

fn mutate(bytes: &mut Vec<u8>, m: &Mutation) {
    let len = bytes.len();
    let at = |i: &Index| if len == 0 { 0 } else { i.index(len) };
    match m {
        Mutation::Truncate(i) => bytes.truncate(at(i)),
        Mutation::FlipBit(i, bit) if len > 0 => bytes[at(i)] ^= 1 << bit,
        Mutation::SetByte(i, v) if len > 0 => bytes[at(i)] = *v,
        Mutation::InflateLength(i, marker, value, insert) => {
            let mut varint = vec![*marker];
            let le = value.to_le_bytes();
            varint.extend_from_slice(match marker {
                0xfb => &le[..2],
                0xfc => &le[..4],
                _ => &le[..8],
            });
            let pos = at(i);
            if *insert || len == 0 {
                bytes.splice(pos..pos, varint);
            } else {
                bytes.splice(pos..pos + 1, varint);
            }
        }
        Mutation::Delete(i, n) if len > 0 => {
            let pos = at(i);
            bytes.drain(pos..(pos + n).min(len));
        }
        Mutation::Duplicate(i, n) if len > 0 => {
            let pos = at(i);
            let chunk = bytes[pos..(pos + n).min(len)].to_vec();
            bytes.splice(pos..pos, chunk);
        }
        Mutation::Append(tail) => bytes.extend_from_slice(tail),
        _ => {}
    }
}

/// Mostly one mutation (most often still close to valid), sometimes a few.
fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop_oneof![
        3 => proptest::collection::vec(mutation(), 1..2),
        1 => proptest::collection::vec(mutation(), 2..5),
    ]
}

fn encver() -> impl Strategy<Value = i32> {
    prop_oneof![8 => Just(BUDGET_ENCVER), 2 => Just(1), 1 => -2i32..6]
}

// ---------------------------------------------------------------------------------------------
// What an accepted value must satisfy.
// ---------------------------------------------------------------------------------------------

/// A decoded budget: invariants hold, it round-trips, and commands on it at random times
/// (including far past its clock and at the i64 edge) neither panic nor break an invariant.
fn check_budget(b: Budget, times: &[i64]) -> Result<(), TestCaseError> {
    prop_assert!(b.check_invariants().is_ok(), "{:?}", b.check_invariants());
    let again = decode_budget(BUDGET_ENCVER, &encode_budget(&b));
    prop_assert_eq!(again.as_ref(), Ok(&b), "re-encoding changed the value");
    let policy = Policy {
        keep_ms: 1_000,
        max_pending: i64::MAX,
    };
    let mut b = b;
    let mut ids: Vec<Vec<u8>> = b.book().entries().map(|(id, _)| id.to_vec()).collect();
    for (i, &t) in times.iter().enumerate() {
        let t = b.now(t);
        let v = b.view(t);
        prop_assert_eq!(
            i128::from(v.available),
            (i128::from(v.limit) - i128::from(v.used) - i128::from(v.reserved))
                .clamp(i128::from(i64::MIN), i128::from(i64::MAX))
        );
        let listed: i128 = b
            .pending(t, usize::MAX)
            .iter()
            .map(|p| i128::from(p.amount))
            .sum();
        prop_assert_eq!(listed, i128::from(v.reserved));
        let _ = b.retry_after(t, 1);
        let _ = b.next_due(policy.keep_ms);
        for e in b.plan_sweep(t, policy.keep_ms, 16) {
            prop_assert!(b.apply(t, &e).is_ok(), "sweep effect {:?} refused", e);
        }
        let pick = i.wrapping_mul(7919);
        let op = match i % 5 {
            0 => Op::Reserve {
                amount: 1,
                id: None,
                ttl: Some(10),
            },
            1 => Op::Settle { pick, actual: 3 },
            2 => Op::Charge {
                amount: 2,
                id: Some(9),
                force: true,
            },
            3 => Op::Rollback { pick },
            _ => Op::Extend { pick, ttl: 50 },
        };
        // A refused effect is an error reply in the server; what matters here is that nothing
        // panics and the invariants hold. (At times where the period's bounds cannot be computed,
        // past year 9999, a plan may count a fresh period whose Reset it cannot emit: the
        // effect is then refused with an overflow.)
        let mut now = t;
        let _ = run_op(&mut b, &mut now, &policy, &mut ids, &op);
        prop_assert!(b.check_invariants().is_ok(), "{:?}", b.check_invariants());
    }
    Ok(())
}

/// A decoded window: valid, round-trips, and checks and records at random times stay valid.
fn check_window(w: Window, times: &[i64]) -> Result<(), TestCaseError> {
    prop_assert!(w.validate().is_ok(), "{:?}", w.validate());
    let again = decode_window(WINDOW_ENCVER, &encode_window(&w));
    prop_assert_eq!(again.as_ref(), Ok(&w), "re-encoding changed the value");
    let mut w = w;
    let _ = w.empty_at_ms();
    let _ = w.allocations();
    for (i, &t) in times.iter().enumerate() {
        let window_ms = [1, 1000, 60_000, i64::MAX][i % 4];
        let precision = [1, 1000, 60_000, i64::MAX / 4096 + 1][i % 4].min(window_ms);
        let Ok(p) = WindowParams::parse(10, window_ms, Some(1), Some(precision)) else {
            continue;
        };
        let _ = w.check(&p, t);
        let _ = w.record(&p, t);
        prop_assert!(w.validate().is_ok(), "{:?}", w.validate());
        // The remembered ids of a decoded value: planned and applied without a panic.
        let ids: Vec<Vec<u8>> = w.remembered().iter().map(|(id, _)| id.to_vec()).collect();
        for id in ids {
            let _ = w.plan_id_reserve(t, &id, 1, i64::MAX);
            if w.plan_id_settle(t, &id, 7)
                .is_ok_and(|p| matches!(p, IdPlan::Corrected { .. }))
            {
                w.apply(
                    t,
                    &WindowEffect::Settle {
                        id: id[..].into(),
                        actual: 7,
                    },
                )
                .unwrap();
            } else if w
                .plan_id_rollback(t, &id)
                .is_ok_and(|p| matches!(p, IdPlan::RolledBack { .. }))
            {
                w.apply(t, &WindowEffect::Rollback { id: id[..].into() })
                    .unwrap();
            }
            prop_assert!(w.validate().is_ok(), "{:?}", w.validate());
        }
        let _ = w.apply(t, &WindowEffect::Forget);
        prop_assert!(w.validate().is_ok(), "{:?}", w.validate());
    }
    Ok(())
}

fn times() -> impl Strategy<Value = Vec<i64>> {
    proptest::collection::vec(
        prop_oneof![
            T0..T0 + 10_000_000,
            Just(0i64),
            Just(i64::MAX),
            Just(i64::MAX - 1),
            any::<i64>().prop_map(|t| t.max(0)),
        ],
        0..6,
    )
}

/// Valid encodings round-trip exactly (the generator itself is sound).
#[test]
fn valid_encodings_round_trip() {
    fuzz((budget(), window()), |((b, _), w)| {
        let (eb, ew) = (encode_budget(&b), encode_window(&w));
        prop_assert_eq!(decode_budget(BUDGET_ENCVER, &eb), Ok(b));
        prop_assert_eq!(decode_window(WINDOW_ENCVER, &ew), Ok(w));
        Ok(())
    });
}

#[test]
fn budget_decoder_survives_mutations() {
    fuzz(
        (budget(), mutations(), encver(), times()),
        |((b, _), ms, ver, t)| {
            let mut bytes = encode_budget(&b);
            for m in &ms {
                mutate(&mut bytes, m);
            }
            if let Ok(decoded) = decode_budget(ver, &bytes) {
                check_budget(decoded, &t)?;
            }
            Ok(())
        },
    );
}

#[test]
fn window_decoder_survives_mutations() {
    let ver = prop_oneof![8 => Just(WINDOW_ENCVER), 1 => -2i32..4];
    fuzz((window(), mutations(), ver, times()), |(w, ms, ver, t)| {
        let mut bytes = encode_window(&w);
        for m in &ms {
            mutate(&mut bytes, m);
        }
        if let Ok(decoded) = decode_window(ver, &bytes) {
            check_window(decoded, &t)?;
        }
        Ok(())
    });
}

/// Random bytes: both decoders, every encoding version, either type's bytes to either decoder.
#[test]
fn decoders_survive_random_bytes() {
    let bytes = proptest::collection::vec(any::<u8>(), 0..512);
    fuzz((bytes, -1i32..4, times()), |(bytes, ver, t)| {
        if let Ok(b) = decode_budget(ver, &bytes) {
            check_budget(b, &t)?;
        }
        if let Ok(w) = decode_window(ver, &bytes) {
            check_window(w, &t)?;
        }
        Ok(())
    });
}

/// A window's bytes given to the budget decoder and the other way round.
#[test]
fn decoders_refuse_the_other_type() {
    fuzz((budget(), window(), times()), |((b, _), w, t)| {
        if let Ok(b) = decode_budget(BUDGET_ENCVER, &encode_window(&w)) {
            check_budget(b, &t)?;
        }
        if let Ok(w) = decode_window(WINDOW_ENCVER, &encode_budget(&b)) {
            check_window(w, &t)?;
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// The effect decoder (QUOTA.APPLY tokens).
// ---------------------------------------------------------------------------------------------

fn token() -> impl Strategy<Value = Vec<u8>> {
    let word = prop_oneof![
        Just("CONFIG"),
        Just("RESET"),
        Just("GRANT"),
        Just("SETTLE"),
        Just("LATE"),
        Just("ROLLBACK"),
        Just("RELEASE"),
        Just("EXTEND"),
        Just("CHARGE"),
        Just("CHARGEID"),
        Just("FORGET"),
        Just("LOGGED"),
        Just("USAGE"),
        Just("-"),
        Just("NONE"),
        Just("DAY"),
        Just("MONTH"),
        Just("UTC"),
        Just("Europe/Paris"),
        Just("+05:30"),
        Just("config"),
    ]
    .prop_map(|s| s.as_bytes().to_vec());
    let number = prop_oneof![
        any::<i64>(),
        Just(i64::MAX),
        Just(i64::MIN),
        Just(0i64),
        Just(-1i64),
        0i64..1000,
    ]
    .prop_map(|n| n.to_string().into_bytes());
    let odd = prop_oneof![
        Just(b"9223372036854775808".to_vec()),
        Just(b"-9223372036854775809".to_vec()),
        Just(b"+1".to_vec()),
        Just(b" 1".to_vec()),
        Just(b"".to_vec()),
        Just(b"1-0".to_vec()),
    ];
    prop_oneof![
        4 => word,
        4 => number,
        1 => odd,
        1 => proptest::collection::vec(any::<u8>(), 0..24),
    ]
}

fn effect() -> impl Strategy<Value = Effect> {
    // Up to 40 bytes: ids stored inline (≤ 24) and on the heap.
    let id = proptest::collection::vec(any::<u8>(), 1..40).prop_map(Id::from_vec);
    let n = prop_oneof![any::<i64>(), 0i64..1000];
    prop_oneof![
        (
            amount(),
            amount(),
            0i64..100,
            proptest::option::of(amount()),
            1i64..1_000_000,
            period()
        )
            .prop_map(|(limit, used, overdraft, max_reserve, ttl, period)| {
                let bounds = period.bounds(T0).unwrap();
                Effect::Configure {
                    settings: Box::new(Settings {
                        limit,
                        overdraft,
                        max_reserve,
                        default_ttl_ms: ttl,
                        on_expire: if used % 2 == 0 {
                            OnExpire::Release
                        } else {
                            OnExpire::Elapsed
                        },
                        unit_ms: Some(1000),
                    }),
                    used,
                    period: Box::new(period),
                    bounds,
                }
            }),
        (n.clone(), n.clone()).prop_map(|(start_ms, end_ms)| Effect::Reset { start_ms, end_ms }),
        (id.clone(), n.clone(), n.clone()).prop_map(|(id, amount, deadline_ms)| Effect::Grant {
            id,
            amount,
            deadline_ms
        }),
        (id.clone(), n.clone()).prop_map(|(id, actual)| Effect::Settle { id, actual }),
        (id.clone(), n.clone()).prop_map(|(id, actual)| Effect::SettleLate { id, actual }),
        id.clone().prop_map(|id| Effect::Rollback { id }),
        // RELEASE never carries a charge (the wire form has none to carry).
        (id.clone(), n.clone()).prop_map(|(id, charge)| match charge % 3 {
            0 => Effect::Release {
                id,
                on_expire: OnExpire::Release,
                charge: 0,
            },
            1 => Effect::Release {
                id,
                on_expire: OnExpire::Charge,
                charge,
            },
            _ => Effect::Release {
                id,
                on_expire: OnExpire::Elapsed,
                charge,
            },
        }),
        (id.clone(), n.clone()).prop_map(|(id, deadline_ms)| Effect::Extend { id, deadline_ms }),
        (
            n.clone(),
            n.clone(),
            proptest::option::of(id.clone()),
            any::<bool>()
        )
            .prop_map(|(amount, overrun, id, forced)| Effect::Charge {
                amount,
                overrun,
                id,
                forced
            }),
        id.clone().prop_map(|id| Effect::Forget { id }),
        (proptest::option::of(id), 0i64..2_000_000).prop_map(|(stream, max_len)| {
            Effect::Usage {
                log: stream.map(|s| UsageLog {
                    stream: s.to_vec(),
                    max_len,
                }),
            }
        }),
    ]
}

/// Random token lists: an error or effects, never a panic; decoded effects applied to a budget
/// either apply or are refused, leaving the invariants intact.
#[test]
fn effect_decoder_survives_random_tokens() {
    let tokens = proptest::collection::vec(token(), 0..24);
    fuzz((tokens, budget()), |(tokens, (b, now))| {
        // LOGGED marks: each after an effect that logs, at most one per effect, in order.
        if let Ok((list, logged)) = effects::decode_logged(tokens.iter().map(Vec::as_slice)) {
            let afters: Vec<usize> = logged.iter().map(|l| l.after).collect();
            prop_assert!(afters.windows(2).all(|w| w[0] < w[1]), "{afters:?}");
            for l in &logged {
                prop_assert!(list.get(l.after).is_some_and(usage::logs), "{l:?}");
                prop_assert!(l.len >= 1 && (l.ms, l.seq) != (0, 0), "{l:?}");
            }
            if logged.is_empty() {
                prop_assert!(effects::decode(tokens.iter().map(Vec::as_slice)).is_ok());
            } else {
                prop_assert!(effects::decode(tokens.iter().map(Vec::as_slice)).is_err());
            }
        }
        if let Ok(list) = effects::decode(tokens.iter().map(Vec::as_slice)) {
            let mut b = b;
            for e in &list {
                let _ = b.apply(now, e);
                prop_assert!(
                    b.check_invariants().is_ok(),
                    "{:?} after {:?}",
                    b.check_invariants(),
                    e
                );
            }
        }
        Ok(())
    });
}

/// Encoding then decoding gives the same effects back, and mutated token lists (one token
/// dropped or replaced) decode without panicking.
#[test]
fn effect_tokens_round_trip() {
    let list = proptest::collection::vec(effect(), 0..6);
    fuzz(
        (list, any::<Index>(), token()),
        |(list, drop_at, replacement)| {
            let mut tokens = Vec::new();
            for e in &list {
                effects::write(e, &mut tokens);
            }
            let back = effects::decode(tokens.iter().map(Vec::as_slice));
            prop_assert_eq!(back.as_ref().ok(), Some(&list), "{:?}", back.as_ref().err());
            if !tokens.is_empty() {
                let i = drop_at.index(tokens.len());
                let mut dropped = tokens.clone();
                dropped.remove(i);
                let _ = effects::decode(dropped.iter().map(Vec::as_slice));
                tokens[i] = replacement;
                let _ = effects::decode(tokens.iter().map(Vec::as_slice));
            }
            Ok(())
        },
    );
}

/// The packed form (`QUOTA.APPLY key <packed>`): packing then unpacking gives the token form
/// back and decodes to the same effects, whatever bytes the ids hold; any byte string, and
/// any packed string with one byte changed or cut short, unpacks or fails without panicking.
#[test]
fn packed_effects_round_trip() {
    let list = proptest::collection::vec(effect(), 1..6);
    let junk = proptest::collection::vec(any::<u8>(), 0..64);
    fuzz(
        (list, any::<i64>(), any::<Index>(), any::<u8>(), junk),
        |(list, at, at_byte, byte, junk)| {
            let packed = redis_quota::shell::replicate::pack_effects(at, &list);
            let bytes = packed.as_bytes().to_vec();
            let mut tokens = vec![at.to_string().into_bytes()];
            for e in &list {
                effects::write(e, &mut tokens);
            }
            let unpacked =
                effects::unpack(&bytes).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            prop_assert_eq!(&unpacked, &tokens);
            let back = effects::decode(unpacked.into_iter().skip(1));
            prop_assert_eq!(back.as_ref().ok(), Some(&list));
            let i = at_byte.index(bytes.len());
            let mut changed = bytes.clone();
            changed[i] = byte;
            if let Ok(t) = effects::unpack(&changed) {
                let _ = effects::decode(t.into_iter().skip(1));
            }
            let _ = effects::unpack(&bytes[..i]);
            if let Ok(t) = effects::unpack(&junk) {
                let _ = effects::decode(t);
            }
            Ok(())
        },
    );
}

/// Effects with `LOGGED` marks after some of the ones that log (random ids and lengths): the
/// token and packed forms decode to the same effects and marks; one token dropped or replaced
/// decodes or fails without panicking, and never to a mark on an effect that cannot log.
#[test]
fn logged_marks_round_trip() {
    let list = proptest::collection::vec(
        (
            effect(),
            any::<bool>(),
            1u64..u64::MAX,
            any::<u64>(),
            1i64..i64::MAX,
        ),
        1..6,
    );
    fuzz(
        (list, any::<i64>(), any::<Index>(), token()),
        |(list, at, at_token, replacement)| {
            let effects_only: Vec<Effect> = list.iter().map(|x| x.0.clone()).collect();
            let marks: Vec<Logged> = list
                .iter()
                .enumerate()
                .filter(|(_, (e, mark, ..))| *mark && usage::logs(e))
                .map(|(after, (_, _, ms, seq, len))| Logged {
                    after,
                    ms: *ms,
                    seq: *seq,
                    len: *len,
                })
                .collect();
            let mut tokens: Vec<Vec<u8>> = Vec::new();
            effects::write_all(&effects_only, &marks, &mut tokens);
            let back = effects::decode_logged(tokens.iter().map(Vec::as_slice));
            prop_assert_eq!(
                back.as_ref().ok(),
                Some(&(effects_only.clone(), marks.clone())),
                "{:?}",
                back.as_ref().err()
            );
            let mut packed = effects::Packed::with_capacity(64);
            effects::TokenSink::int(&mut packed, at);
            effects::write_all(&effects_only, &marks, &mut packed);
            let unpacked = effects::unpack(packed.as_bytes())
                .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            let back = effects::decode_logged(unpacked.into_iter().skip(1));
            prop_assert_eq!(back.ok(), Some((effects_only, marks)));
            let i = at_token.index(tokens.len());
            let mut changed = tokens.clone();
            changed.remove(i);
            for t in [changed, {
                let mut t = tokens.clone();
                t[i] = replacement;
                t
            }] {
                if let Ok((list, logged)) = effects::decode_logged(t.iter().map(Vec::as_slice)) {
                    for l in &logged {
                        prop_assert!(list.get(l.after).is_some_and(usage::logs));
                    }
                }
            }
            Ok(())
        },
    );
}
