//! Model-based property test of multi-limit admission (issue 19, `src/core/multi.rs`): random
//! MRESERVE / MSETTLE / MROLLBACK sequences over mixed budget and window keys run through the
//! master path (`plan_m*`, then `apply` of every key's effects) and, independently, through a
//! reference model written from the spec: budgets as maps of id → reservation, windows as an
//! exact sliding log (precision 1 ms) of counted events and remembered ids.
//!
//! Checked after every step: the reply (grant, retry, the first denying key and its retry
//! time, each key's status and amount, the error code), that a denial, a retry or an error
//! plans nothing for any key (all or nothing), every key's logical state (available / used /
//! reserved; counted and each id's state), the invariants, and the window's encoding round
//! trip. Covered on purpose: retries in another key order and with other amounts or keys,
//! expiry ties (a deadline or a bucket edge exactly at `now`), late settles, a key replaced
//! by a fresh one between reserve and settle (a budget then answers `NORESERVATION`, a window
//! `skipped`), and amounts at the edge of `i64` (limits of `i64::MAX`).

use std::collections::BTreeMap;

use proptest::prelude::*;
use redis_quota::core::error::LedgerError;
use redis_quota::core::ledger::{Budget, Policy, Settings};
use redis_quota::core::multi::{
    plan_mreserve, plan_mrollback, plan_msettle, KeyEffects, KeyError, KeyStatus, Limit, MReserve,
};
use redis_quota::core::period::Period;
use redis_quota::core::remembered::IdStatus;
use redis_quota::core::window::{Window, WindowConfig, WindowEffect};
use redis_quota::shell::persist::{decode_window, encode_window, WINDOW_ENCVER};

const T0: i64 = 1_700_000_000_000;
const MAX: i64 = i64::MAX;

// ---- the reference model ------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
enum Done {
    Settled(i64),
    RolledBack,
}

#[derive(Clone, Debug)]
struct RBudget {
    limit: i64,
    used: i64,
    overrun: i64,
    /// id → (amount, deadline); expired once `now >= deadline` (kept: a late settle finds it).
    pending: BTreeMap<Vec<u8>, (i64, i64)>,
    done: BTreeMap<Vec<u8>, Done>,
}

#[derive(Clone, Debug)]
struct RWindow {
    limit: i64,
    window: i64,
    /// Physically held events (ms → count), dropped only by a count (a record).
    events: BTreeMap<i64, i64>,
    /// id → (t, amount, counted, status).
    ids: BTreeMap<Vec<u8>, (i64, i64, i64, IdStatus)>,
}

#[derive(Clone, Debug)]
enum RKey {
    Budget(RBudget),
    Window(RWindow),
}

impl RBudget {
    fn reserved(&self, now: i64) -> i64 {
        self.pending
            .values()
            .filter(|(_, d)| *d > now)
            .map(|(a, _)| *a)
            .sum()
    }
    fn available(&self, now: i64) -> i64 {
        self.limit - self.used - self.reserved(now)
    }
}

impl RWindow {
    fn alive(&self, t: i64, now: i64) -> bool {
        t + self.window > now
    }
    fn counted(&self, now: i64) -> i64 {
        self.events
            .iter()
            .filter(|(t, _)| self.alive(**t, now))
            .map(|(_, c)| *c)
            .sum()
    }
    fn total(&self) -> i128 {
        self.events.values().map(|c| *c as i128).sum()
    }
    fn id(&self, id: &[u8], now: i64) -> Option<(i64, i64, i64, IdStatus)> {
        self.ids
            .get(id)
            .copied()
            .filter(|(t, ..)| self.alive(*t, now))
    }
    /// Exact ms until `cost` fits (no other traffic), -1 if it never does.
    fn retry_after(&self, cost: i64, now: i64) -> i64 {
        if cost > self.limit {
            return -1;
        }
        let mut counted = self.counted(now) as i128;
        for (t, c) in self.events.iter().filter(|(t, _)| self.alive(**t, now)) {
            counted -= *c as i128;
            if counted + cost as i128 <= self.limit as i128 {
                return t + self.window - now;
            }
        }
        0
    }
    fn record(&mut self, now: i64, cost: i64, id: Option<&[u8]>) {
        let w = self.window;
        self.events.retain(|t, _| t + w > now);
        if cost > 0 {
            *self.events.entry(now).or_insert(0) += cost;
        }
        if let Some(id) = id {
            self.ids
                .insert(id.to_vec(), (now, cost, cost, IdStatus::Pending));
        }
        self.ids.retain(|_, (t, ..)| *t + w > now);
    }
    fn adjust(&mut self, t: i64, delta: i64) {
        let c = self.events.get(&t).copied().unwrap_or(0) + delta;
        if c > 0 {
            self.events.insert(t, c);
        } else {
            self.events.remove(&t);
        }
    }
}

/// What the model expects of one key in a multi-key command.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Expect {
    Grant,
    Retried,
    Denied(i64),
    Status(KeyStatus, i64),
    Err(&'static str),
}

fn code(e: &LedgerError) -> &'static str {
    match e {
        LedgerError::Conflict { .. } => "CONFLICT",
        LedgerError::NoReservation { .. } => "NORESERVATION",
        LedgerError::Overflow => "OVERFLOW",
        LedgerError::TooManyPending { .. } | LedgerError::TooManyRemembered { .. } => "LIMIT",
        LedgerError::TooLarge { .. } => "TOOLARGE",
        _ => "ERR",
    }
}

fn expect_reserve(k: &RKey, id: &[u8], amount: i64, now: i64) -> Expect {
    match k {
        RKey::Budget(b) => {
            if let Some((a, d)) = b.pending.get(id) {
                return if *d > now && *a == amount {
                    Expect::Retried
                } else {
                    Expect::Err("CONFLICT")
                };
            }
            if b.done.contains_key(id) {
                return Expect::Err("CONFLICT");
            }
            if amount > b.available(now) {
                Expect::Denied(-1)
            } else {
                Expect::Grant
            }
        }
        RKey::Window(w) => match w.id(id, now) {
            Some((_, a, _, IdStatus::Pending)) if a == amount => Expect::Retried,
            Some(_) => Expect::Err("CONFLICT"),
            None if w.counted(now) as i128 + amount as i128 <= w.limit as i128 => Expect::Grant,
            None => Expect::Denied(w.retry_after(amount, now)),
        },
    }
}

fn expect_settle(k: &RKey, id: &[u8], actual: i64, now: i64) -> Expect {
    match k {
        RKey::Budget(b) => {
            if let Some((amount, d)) = b.pending.get(id) {
                let (live, minus) = if *d > now {
                    (true, *amount)
                } else {
                    (false, 0)
                };
                let total =
                    b.used as i128 + b.reserved(now) as i128 - minus as i128 + actual as i128;
                let overrun = b.overrun as i128 + (actual - amount).max(0) as i128;
                if total > MAX as i128 || overrun > MAX as i128 {
                    return Expect::Err("OVERFLOW");
                }
                let status = if live {
                    KeyStatus::Settled
                } else {
                    KeyStatus::Late
                };
                return Expect::Status(status, actual);
            }
            match b.done.get(id) {
                Some(Done::Settled(a)) if *a == actual => Expect::Status(KeyStatus::Duplicate, *a),
                Some(_) => Expect::Err("CONFLICT"),
                None => Expect::Err("NORESERVATION"),
            }
        }
        RKey::Window(w) => match w.id(id, now) {
            None => Expect::Status(KeyStatus::Skipped, actual),
            Some((t, _, counted, IdStatus::Pending)) => {
                let delta = actual as i128 - counted as i128;
                let bucket = w.events.get(&t).copied().unwrap_or(0) as i128;
                if bucket + delta > MAX as i128 || w.total() + delta > MAX as i128 {
                    Expect::Err("OVERFLOW")
                } else {
                    Expect::Status(KeyStatus::Corrected, actual)
                }
            }
            Some((_, _, counted, IdStatus::Settled)) if counted == actual => {
                Expect::Status(KeyStatus::Duplicate, actual)
            }
            // Its count was given back: no correction, not an error (the budgets decide).
            Some((_, _, _, IdStatus::RolledBack)) => Expect::Status(KeyStatus::Skipped, actual),
            Some(_) => Expect::Err("CONFLICT"),
        },
    }
}

fn expect_rollback(k: &RKey, id: &[u8], now: i64) -> Expect {
    match k {
        RKey::Budget(b) => {
            if let Some((amount, d)) = b.pending.get(id) {
                return if *d > now {
                    Expect::Status(KeyStatus::RolledBack, *amount)
                } else {
                    Expect::Status(KeyStatus::Expired, 0)
                };
            }
            match b.done.get(id) {
                Some(Done::RolledBack) => Expect::Status(KeyStatus::Duplicate, 0),
                Some(_) => Expect::Err("CONFLICT"),
                None => Expect::Err("NORESERVATION"),
            }
        }
        RKey::Window(w) => match w.id(id, now) {
            None => Expect::Status(KeyStatus::Skipped, 0),
            Some((_, _, counted, IdStatus::Pending)) => {
                Expect::Status(KeyStatus::RolledBack, counted)
            }
            Some((_, _, _, IdStatus::RolledBack)) => Expect::Status(KeyStatus::Duplicate, 0),
            Some(_) => Expect::Err("CONFLICT"),
        },
    }
}

// ---- the real keys ------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Key {
    Budget(Box<Budget>),
    Window(Window),
}

fn new_budget(limit: i64, now: i64) -> Budget {
    let settings = Settings::plain(limit, 0, None, 1000);
    let configure = Budget::plan_create(now, settings, 0, Period::none()).unwrap();
    let mut b = Budget::new(settings, now);
    b.apply(now, &configure).unwrap();
    b
}

fn new_window(limit: i64, window: i64, now: i64) -> Window {
    let cfg = WindowConfig::parse(limit, window, Some(1)).unwrap();
    let mut w = Window::new(&cfg.params(0), now);
    w.apply(now, &WindowEffect::Configure(cfg)).unwrap();
    w
}

fn limits<'k>(keys: &'k [Key], pick: &[usize]) -> Vec<Limit<'k>> {
    pick.iter()
        .map(|&i| match &keys[i] {
            Key::Budget(b) => Limit::Budget(b),
            Key::Window(w) => Limit::Window(w),
        })
        .collect()
}

fn apply(keys: &mut [Key], pick: &[usize], effects: &[KeyEffects], wall: i64) {
    for (&i, e) in pick.iter().zip(effects) {
        match (&mut keys[i], e) {
            (Key::Budget(b), KeyEffects::Budget { now, effects }) => {
                for e in effects {
                    b.apply(*now, e).unwrap();
                }
            }
            (Key::Window(w), KeyEffects::Window(effects)) => {
                for e in effects {
                    w.apply(wall, e).unwrap();
                }
            }
            other => panic!("effects of the wrong kind: {other:?}"),
        }
    }
}

// ---- operations ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Reserve {
        pick: Vec<usize>,
        amounts: Vec<i64>,
        id: Option<u8>,
        ttl: i64,
    },
    Settle {
        pick: Vec<usize>,
        id: u8,
        actuals: Vec<i64>,
    },
    Rollback {
        pick: Vec<usize>,
        id: u8,
    },
    /// A plain counted call on a window (config form, no id).
    Count {
        key: usize,
        cost: i64,
    },
    Advance(i64),
    /// The key is deleted and created again with the same configuration.
    Replace(usize),
}

const KEYS: usize = 4;

fn amount() -> impl Strategy<Value = i64> {
    prop_oneof![
        6 => 0i64..60,
        1 => Just(0i64),
        1 => Just(MAX),
        1 => Just(MAX - 1),
        1 => Just(MAX / 2),
    ]
}

fn pick() -> impl Strategy<Value = Vec<usize>> {
    Just((0..KEYS).collect::<Vec<_>>())
        .prop_shuffle()
        .prop_flat_map(|all| (1..=KEYS).prop_map(move |n| all[..n].to_vec()))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (pick(), prop::collection::vec(amount(), KEYS), prop::option::weighted(0.7, 0u8..4), 1i64..120)
            .prop_map(|(pick, amounts, id, ttl)| {
                let n = pick.len();
                Op::Reserve { pick, amounts: amounts[..n].to_vec(), id, ttl }
            }),
        3 => (pick(), 0u8..6, prop::collection::vec(amount(), KEYS))
            .prop_map(|(pick, id, actuals)| {
                let n = pick.len();
                Op::Settle { pick, id, actuals: actuals[..n].to_vec() }
            }),
        2 => (pick(), 0u8..6).prop_map(|(pick, id)| Op::Rollback { pick, id }),
        1 => (0..KEYS, amount()).prop_map(|(key, cost)| Op::Count { key, cost }),
        3 => prop_oneof![0i64..40, Just(0i64), Just(50i64), Just(100i64)].prop_map(Op::Advance),
        1 => (0..KEYS).prop_map(Op::Replace),
    ]
}

/// Key kinds and limits: two budgets and two windows, limits small or `i64::MAX`.
fn setup() -> impl Strategy<Value = Vec<(bool, i64, i64)>> {
    prop::collection::vec(
        (
            any::<bool>(),
            prop_oneof![Just(100i64), Just(MAX), 1i64..10],
            prop_oneof![Just(50i64), Just(100i64)],
        ),
        KEYS,
    )
}

fn id_name(n: u8) -> Vec<u8> {
    format!("id{n}").into_bytes()
}

struct Run {
    now: i64,
    keys: Vec<Key>,
    model: Vec<RKey>,
    /// Generated ids handed out, so later ops can name them (`id` 4 and 5 pick the latest).
    generated: Vec<Vec<u8>>,
    spec: Vec<(bool, i64, i64)>,
}

impl Run {
    fn id(&self, n: u8) -> Vec<u8> {
        match n {
            4 | 5 => self
                .generated
                .iter()
                .rev()
                .nth(usize::from(n - 4))
                .cloned()
                .unwrap_or_else(|| id_name(n)),
            _ => id_name(n),
        }
    }

    fn fresh(&mut self, i: usize) {
        let (budget, limit, window) = self.spec[i];
        if budget {
            self.keys[i] = Key::Budget(Box::new(new_budget(limit, self.now)));
            self.model[i] = RKey::Budget(RBudget {
                limit,
                used: 0,
                overrun: 0,
                pending: BTreeMap::new(),
                done: BTreeMap::new(),
            });
        } else {
            self.keys[i] = Key::Window(new_window(limit, window, self.now));
            self.model[i] = RKey::Window(RWindow {
                limit,
                window,
                events: BTreeMap::new(),
                ids: BTreeMap::new(),
            });
        }
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let now = self.now;
        let policy = Policy::default();
        match op {
            Op::Advance(dt) => self.now += dt,
            Op::Replace(i) => self.fresh(*i),
            Op::Count { key, cost } => {
                if let (Key::Window(w), RKey::Window(m)) =
                    (&mut self.keys[*key], &mut self.model[*key])
                {
                    let cfg = *w.config().unwrap();
                    let d = w.check(&cfg.params(*cost), now).unwrap();
                    let fits = m.counted(now) as i128 + *cost as i128 <= m.limit as i128;
                    prop_assert_eq!(d.allowed, fits);
                    if d.allowed {
                        w.apply(
                            now,
                            &WindowEffect::Count {
                                window_ms: cfg.window_ms,
                                precision_ms: 1,
                                cost: *cost,
                                id: None,
                            },
                        )
                        .unwrap();
                        m.record(now, *cost, None);
                    }
                }
            }
            Op::Reserve {
                pick,
                amounts,
                id,
                ttl,
            } => {
                let client = id.map(|n| self.id(n));
                let snapshot = self.keys.clone();
                let lim = limits(&snapshot, pick);
                let got = plan_mreserve(&lim, amounts, client.as_deref(), Some(*ttl), now, &policy);
                let the_id = match (&got, &client) {
                    (Ok(MReserve::Granted { id, .. }), None) => id.to_vec(),
                    (_, Some(c)) => c.clone(),
                    (_, None) => b"unused".to_vec(),
                };
                // The model, key by key in order: the first error wins, then a mix of retries
                // and new keys is a CONFLICT (at the first new key), then a retry, then the
                // first denial. An error names the key it is about.
                let expects: Vec<Expect> = pick
                    .iter()
                    .zip(amounts)
                    .map(|(&i, &a)| expect_reserve(&self.model[i], &the_id, a, now))
                    .collect();
                let retried = expects.iter().filter(|e| **e == Expect::Retried).count();
                let first_err = expects.iter().position(|e| matches!(e, Expect::Err(_)));
                let first_new = expects.iter().position(|e| *e != Expect::Retried);
                let want: Result<&str, &str> =
                    if let Some(Expect::Err(c)) = first_err.and_then(|i| expects.get(i)) {
                        Err(c)
                    } else if retried > 0 && retried < expects.len() {
                        Err("CONFLICT")
                    } else if retried > 0 {
                        Ok("retried")
                    } else if expects.iter().any(|e| matches!(e, Expect::Denied(_))) {
                        Ok("denied")
                    } else {
                        Ok("granted")
                    };
                match (&got, want) {
                    (Err(e), Err(c)) => {
                        prop_assert_eq!(code(&e.error), c, "{:?}", e);
                        prop_assert_eq!(e.index, first_err.or(first_new), "{:?}", e);
                    }
                    (Ok(MReserve::Retried { id }), Ok("retried")) => {
                        prop_assert_eq!(id.to_vec(), the_id)
                    }
                    (
                        Ok(MReserve::Denied {
                            index,
                            retry_after_ms,
                        }),
                        Ok("denied"),
                    ) => {
                        let first = expects
                            .iter()
                            .position(|e| matches!(e, Expect::Denied(_)))
                            .unwrap();
                        prop_assert_eq!(*index, first);
                        prop_assert_eq!(Expect::Denied(*retry_after_ms), expects[first].clone());
                    }
                    (
                        Ok(MReserve::Granted {
                            id,
                            effects,
                            remaining,
                        }),
                        Ok("granted"),
                    ) => {
                        if client.is_none() {
                            // A generated id is new on every listed key.
                            for &i in pick {
                                let known = match &self.model[i] {
                                    RKey::Budget(b) => {
                                        b.pending.contains_key(&id[..])
                                            || b.done.contains_key(&id[..])
                                    }
                                    RKey::Window(w) => w.ids.contains_key(&id[..]),
                                };
                                prop_assert!(!known, "generated id {:?} was known", id);
                            }
                            self.generated.push(id.to_vec());
                        }
                        prop_assert!(effects.iter().all(|e| !e.is_empty()));
                        apply(&mut self.keys, pick, effects, now);
                        // A window's planned remaining is its value once applied.
                        for (&i, r) in pick.iter().zip(remaining) {
                            if let (Some(r), Key::Window(w)) = (r, &self.keys[i]) {
                                prop_assert_eq!(
                                    *r,
                                    redis_quota::core::multi::value(Limit::Window(w), now)
                                );
                            }
                        }
                        for (&i, &a) in pick.iter().zip(amounts) {
                            match &mut self.model[i] {
                                RKey::Budget(b) => {
                                    b.pending.insert(id.to_vec(), (a, now + ttl));
                                }
                                RKey::Window(w) => w.record(now, a, Some(id)),
                            }
                        }
                    }
                    (got, want) => {
                        prop_assert!(false, "got {:?}, model {:?} ({:?})", got, want, expects)
                    }
                }
            }
            Op::Settle { pick, id, actuals } => {
                let id = self.id(*id);
                let snapshot = self.keys.clone();
                let lim = limits(&snapshot, pick);
                let got = plan_msettle(&lim, &id, actuals, now, &policy);
                let expects: Vec<Expect> = pick
                    .iter()
                    .zip(actuals)
                    .map(|(&i, &a)| expect_settle(&self.model[i], &id, a, now))
                    .collect();
                self.check_outcomes(pick, &got, &expects)?;
                if let Ok(outcomes) = got {
                    let effects: Vec<KeyEffects> = outcomes.into_iter().map(|o| o.2).collect();
                    apply(&mut self.keys, pick, &effects, now);
                    for ((&i, &actual), e) in pick.iter().zip(actuals).zip(&expects) {
                        match (&mut self.model[i], e) {
                            (
                                RKey::Budget(b),
                                Expect::Status(KeyStatus::Settled | KeyStatus::Late, _),
                            ) => {
                                let (amount, _) = b.pending.remove(&id).unwrap();
                                b.used += actual;
                                b.overrun += (actual - amount).max(0);
                                b.done.insert(id.clone(), Done::Settled(actual));
                            }
                            (RKey::Window(w), Expect::Status(KeyStatus::Corrected, _)) => {
                                let (t, a, counted, _) = w.ids[&id];
                                w.adjust(t, actual - counted);
                                w.ids.insert(id.clone(), (t, a, actual, IdStatus::Settled));
                            }
                            _ => {}
                        }
                    }
                }
            }
            Op::Rollback { pick, id } => {
                let id = self.id(*id);
                let snapshot = self.keys.clone();
                let lim = limits(&snapshot, pick);
                let got = plan_mrollback(&lim, &id, now, &policy);
                let expects: Vec<Expect> = pick
                    .iter()
                    .map(|&i| expect_rollback(&self.model[i], &id, now))
                    .collect();
                self.check_outcomes(pick, &got, &expects)?;
                if let Ok(outcomes) = got {
                    let effects: Vec<KeyEffects> = outcomes.into_iter().map(|o| o.2).collect();
                    apply(&mut self.keys, pick, &effects, now);
                    for (&i, e) in pick.iter().zip(&expects) {
                        match (&mut self.model[i], e) {
                            (RKey::Budget(b), Expect::Status(KeyStatus::RolledBack, _)) => {
                                b.pending.remove(&id);
                                b.done.insert(id.clone(), Done::RolledBack);
                            }
                            (RKey::Window(w), Expect::Status(KeyStatus::RolledBack, _)) => {
                                let (t, a, counted, _) = w.ids[&id];
                                w.adjust(t, -counted);
                                w.ids.insert(id.clone(), (t, a, 0, IdStatus::RolledBack));
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
        self.compare()
    }

    fn check_outcomes(
        &self,
        pick: &[usize],
        got: &Result<Vec<(KeyStatus, i64, KeyEffects)>, KeyError>,
        expects: &[Expect],
    ) -> Result<(), TestCaseError> {
        let first_err = expects.iter().enumerate().find_map(|(i, e)| match e {
            Expect::Err(c) => Some((i, *c)),
            _ => None,
        });
        match (got, first_err) {
            // The error names the first key at fault.
            (Err(e), Some((i, c))) => {
                prop_assert_eq!(code(&e.error), c, "{:?}", e);
                prop_assert_eq!(e.index, Some(i), "{:?}", e);
            }
            (Ok(outcomes), None) => {
                prop_assert_eq!(outcomes.len(), pick.len());
                for (o, e) in outcomes.iter().zip(expects) {
                    prop_assert_eq!(&Expect::Status(o.0, o.1), e);
                    // Only a change is planned: a duplicate or a skip writes nothing.
                    let changes = matches!(
                        o.0,
                        KeyStatus::Settled
                            | KeyStatus::Late
                            | KeyStatus::Corrected
                            | KeyStatus::RolledBack
                    );
                    if !changes {
                        prop_assert!(o.2.is_empty() || o.0 == KeyStatus::Expired, "{:?}", o);
                    }
                }
            }
            (got, want) => prop_assert!(false, "got {:?}, model {:?} ({:?})", got, want, expects),
        }
        Ok(())
    }

    /// Every key's logical state equals the model's; invariants and encodings hold.
    fn compare(&self) -> Result<(), TestCaseError> {
        let now = self.now;
        for (k, m) in self.keys.iter().zip(&self.model) {
            match (k, m) {
                (Key::Budget(b), RKey::Budget(r)) => {
                    b.check_invariants().unwrap();
                    let v = b.view(now);
                    prop_assert_eq!(
                        (v.used, v.reserved, v.available, v.overrun),
                        (r.used, r.reserved(now), r.available(now), r.overrun)
                    );
                }
                (Key::Window(w), RKey::Window(r)) => {
                    w.validate().unwrap();
                    let cfg = w.config().unwrap();
                    prop_assert_eq!(w.counted(&cfg.params(0), now).unwrap(), r.counted(now));
                    for (id, (t, _amount, counted, status)) in &r.ids {
                        let e = w.id_entry(id, now);
                        if r.alive(*t, now) {
                            let e = e.unwrap();
                            prop_assert_eq!((e.counted, e.status), (*counted, *status));
                        } else {
                            prop_assert!(e.is_none());
                        }
                    }
                    let back = decode_window(WINDOW_ENCVER, &encode_window(w)).unwrap();
                    prop_assert_eq!(&back, w);
                }
                _ => prop_assert!(false, "kinds differ"),
            }
        }
        Ok(())
    }
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(256),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn multi_key_commands_match_the_model(
        spec in setup(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let mut run = Run {
            now: T0,
            keys: vec![Key::Window(new_window(1, 1, T0)); KEYS],
            model: vec![RKey::Budget(RBudget { limit: 0, used: 0, overrun: 0, pending: BTreeMap::new(), done: BTreeMap::new() }); KEYS],
            generated: Vec::new(),
            spec,
        };
        for i in 0..KEYS {
            run.fresh(i);
        }
        for op in &ops {
            run.step(op)?;
        }
    }
}
