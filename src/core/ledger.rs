//! The two-phase budget ledger: limit, used, reserved, available, reservations.
//!
//! Every command is split in two, as in TigerBeetle's state machine and in event sourcing:
//! - **plan** (`Budget::plan_*`, pure, `&self`): decides from the logical state at `now` and
//!   returns a [`Plan`]: the [`Effect`]s to apply plus what to reply. Denials and errors have no
//!   effects.
//! - **apply** (`Budget::apply`, `&mut self`): applies one fully specified effect. The master
//!   applies the plan's effects and replicates exactly those effects; a replica or an AOF replay
//!   applies them too and therefore never reads a clock, a config or makes an id of its own.
//!
//! Logical view: a reservation whose deadline has passed is *expired* (released) even before an
//! effect has released it, and a finished id older than `keep` is *forgotten*. Reads and
//! decisions use this view, so what a client sees never depends on when the cleanup was written.
//!
//! Calendar periods: with a [`Period`], `used` and `overrun` start again from 0 at each period
//! boundary. Pending reservations stay reserved and are charged to the period in which they
//! settle. The reset is logical at once (reads and decisions see a fresh period) and physical
//! through a [`Effect::Reset`] riding on the first write after the boundary; the effect carries
//! the new bounds, so replicas never consult a time-zone database.
//!
//! Invariants (checked by [`Budget::check_invariants`], tested with proptest):
//! `0 <= used`, `0 <= reserved`, `used + reserved <= i64::MAX`,
//! `reserved == sum(pending amounts)`, `available == limit - used - reserved`.

use crate::core::book::{ceil_units, Book, Entry, Finished, Id, Outcome, Reservation};
use crate::core::error::LedgerError;
use crate::core::htree::Measure;
use crate::core::id::{ParsedId, StreamId};
use crate::core::period::Period;
use smallvec::smallvec;

/// Default reservation TTL for a new key: 1 hour.
pub const DEFAULT_TTL_MS: i64 = 3_600_000;
/// How long finished ids are remembered by default: 1 hour.
pub const DEFAULT_KEEP_MS: i64 = 3_600_000;
/// Longest reservation TTL (ms): 10^15 ms, about 31,700 years. Larger TTLs would let a
/// deadline overflow i64 and make every later RESERVE on the key fail.
pub const MAX_TTL_MS: i64 = 1_000_000_000_000_000;

/// A TTL outside `1..=MAX_TTL_MS` (the text spells the bound: a `&'static str` cannot format).
const BAD_TTL: LedgerError =
    LedgerError::Invalid("TTL must be positive and at most 1000000000000000 ms");

/// Generated ids exhausted: only a client id of `18446744073709551615-18446744073709551615`
/// form at or behind the clock does that. Named, not reported as an amount overflow.
pub(crate) const NO_ID_LEFT: LedgerError = LedgerError::Invalid("no id left to generate: pass ID");

fn period_error(e: crate::core::period::PeriodError) -> LedgerError {
    LedgerError::Period(e.to_string())
}

/// Most expired reservations released, and most finished ids forgotten, by one write.
pub const MAINTENANCE_BATCH: usize = 64;

/// Settings a QUOTA.SET applies. All amounts in the tenant's unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub limit: i64,
    /// How far below zero `available` may go through reservations and charges.
    pub overdraft: i64,
    /// Largest single reservation or charge; `None` = no cap.
    pub max_reserve: Option<i64>,
    /// Reservation TTL when RESERVE gives none (ms, > 0).
    pub default_ttl_ms: i64,
    /// What an expired reservation is charged when it is released (`ONEXPIRE`).
    pub on_expire: OnExpire,
    /// The budget's unit of time in ms (`UNIT ms|s|min`: 1, 1000, 60000); `None`: plain units.
    /// Needed by `SETTLE ... ELAPSED` and `ONEXPIRE ELAPSED`.
    pub unit_ms: Option<i64>,
}

impl Settings {
    /// Settings with plain units, expiries released for free (today's behaviour).
    pub fn plain(
        limit: i64,
        overdraft: i64,
        max_reserve: Option<i64>,
        default_ttl_ms: i64,
    ) -> Self {
        Settings {
            limit,
            overdraft,
            max_reserve,
            default_ttl_ms,
            on_expire: OnExpire::Release,
            unit_ms: None,
        }
    }
}

/// The units of time a budget may count in (`UNIT`): ms, s, min.
pub const UNITS_MS: [(&str, i64); 3] = [("ms", 1), ("s", 1000), ("min", 60_000)];

/// What an expired, never-settled reservation costs when it is released (`ONEXPIRE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnExpire {
    /// Nothing: its amount goes back to `available` (the default).
    #[default]
    Release,
    /// Its whole held amount is charged to `used`.
    Charge,
    /// The time from its grant to its last heartbeat (EXTEND), in the budget's unit, rounded
    /// up, at most the held amount; nothing without a heartbeat.
    Elapsed,
}

impl OnExpire {
    /// The name in commands, replies and the wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            OnExpire::Release => "RELEASE",
            OnExpire::Charge => "CHARGE",
            OnExpire::Elapsed => "ELAPSED",
        }
    }

    /// Parses a name (any case).
    pub fn parse(name: &[u8]) -> Option<OnExpire> {
        [OnExpire::Release, OnExpire::Charge, OnExpire::Elapsed]
            .into_iter()
            .find(|p| name.eq_ignore_ascii_case(p.as_str().as_bytes()))
    }
}

/// Default `STREAMMAXLEN` of a usage log: about this many entries are kept (approximate
/// trimming).
pub const DEFAULT_STREAM_MAX_LEN: i64 = 1_000_000;
/// Longest usage stream key name (bytes), as long as the longest id.
pub const MAX_STREAM_KEY_LEN: usize = 65_536;

/// Where a budget logs its usage: a Redis Stream key (`QUOTA.SET ... STREAM key`) and the
/// approximate length it is trimmed to (`STREAMMAXLEN`, 0 = never trimmed). The ledger only
/// stores it; the shell writes the entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageLog {
    /// The stream key: 1..=[`MAX_STREAM_KEY_LEN`] bytes.
    pub stream: Vec<u8>,
    /// Approximate MAXLEN (entries, >= 0; 0: no trimming).
    pub max_len: i64,
}

impl UsageLog {
    /// Checks the stream name's length and the MAXLEN's sign.
    pub fn validate(&self) -> Result<(), LedgerError> {
        if self.stream.is_empty() || self.stream.len() > MAX_STREAM_KEY_LEN {
            return Err(LedgerError::Invalid(
                "the usage stream key must be 1 to 65536 bytes",
            ));
        }
        if self.max_len < 0 {
            return Err(LedgerError::Invalid("STREAMMAXLEN must not be negative"));
        }
        Ok(())
    }
}

/// Per-call policy from the module configs: applied on the master only, while planning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// How long finished ids are remembered (ms).
    pub keep_ms: i64,
    /// Most pending reservations per key (`i64::MAX` = no cap).
    pub max_pending: i64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            keep_ms: DEFAULT_KEEP_MS,
            max_pending: i64::MAX,
        }
    }
}

/// A fully specified state change. Applying the same effects to the same state gives the same
/// state, byte for byte: this is what is replicated and written to the AOF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// QUOTA.SET: new settings, the resulting `used`, the period and its current bounds
    /// (`[start, end)` unix ms; `None` without a period).
    /// Settings and period boxed: QUOTA.SET is rare, and without them inline an effect (and
    /// every plan that carries one, e.g. a multi-key command's per key) is half the size.
    Configure {
        settings: Box<Settings>,
        used: i64,
        period: Box<Period>,
        bounds: Option<(i64, i64)>,
    },
    /// A period boundary passed: used and overrun restart from 0 in `[start_ms, end_ms)`.
    Reset { start_ms: i64, end_ms: i64 },
    /// A new pending reservation created at the step's time.
    Grant {
        id: Id,
        amount: i64,
        deadline_ms: i64,
    },
    /// pending → settled: reserved −= amount, used += actual.
    Settle { id: Id, actual: i64 },
    /// expired → settled late: used += actual.
    SettleLate { id: Id, actual: i64 },
    /// pending → rolled back: reserved −= amount.
    Rollback { id: Id },
    /// pending → expired: reserved −= amount, used += charge (at most the amount; 0 under
    /// `RELEASE`). `on_expire` is the policy that decided the charge (for events and counters).
    Release {
        id: Id,
        on_expire: OnExpire,
        charge: i64,
    },
    /// A pending reservation's new deadline; the step's time is its last heartbeat.
    Extend { id: Id, deadline_ms: i64 },
    /// used += amount; `overrun` is what went beyond available; `id` is remembered if given;
    /// `forced`: charged with FORCE (only the usage log tells it apart).
    Charge {
        amount: i64,
        overrun: i64,
        id: Option<Id>,
        forced: bool,
    },
    /// QUOTA.SET ... STREAM: the usage log from now on (`None`: off).
    Usage { log: Option<UsageLog> },
    /// A finished id is dropped.
    Forget { id: Id },
}

/// A plan's effects, in order. Most commands make one (a grant, a settle, ...) and no cleanup:
/// kept inline, so the common write allocates nothing for them.
pub type Effects = smallvec::SmallVec<[Effect; 1]>;

/// What a plan replies, besides the effects it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan<R> {
    pub effects: Effects,
    pub reply: R,
}

/// The logical numbers of a budget at some time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    pub limit: i64,
    pub used: i64,
    pub reserved: i64,
    /// limit − used − reserved; negative when overdrawn.
    pub available: i64,
    pub overdraft: i64,
    pub max_reserve: Option<i64>,
    pub default_ttl_ms: i64,
    /// Live pending reservations.
    pub pending: i64,
    /// Units charged beyond what was reserved or available.
    pub overrun: i64,
    /// The current period `[start, end)` in unix ms, `None` without a period.
    pub period_bounds: Option<(i64, i64)>,
}

/// The logical state of one id at some time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdState {
    Unknown,
    Pending(Reservation),
    /// Expired at `deadline_ms`; `charged`: what its expiry charges (or charged) to `used`
    /// in the period containing the deadline; `unreleased` while no Release effect has been
    /// applied yet.
    Expired {
        amount: i64,
        charged: i64,
        deadline_ms: i64,
        unreleased: bool,
    },
    Done(Outcome),
}

/// One line of QUOTA.PENDING.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingItem {
    pub id: Id,
    pub amount: i64,
    /// ms since the grant.
    pub age_ms: i64,
    /// ms until it expires.
    pub ttl_ms: i64,
    /// When it was granted (unix ms).
    pub start_ms: i64,
    /// Its last heartbeat (EXTEND, unix ms); `None` if it had none after its grant's ms.
    pub heartbeat_ms: Option<i64>,
}

/// RESERVE's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveReply {
    Granted {
        id: Id,
    },
    /// A retried RESERVE of a pending id with the same amount: nothing changes.
    Retried {
        id: Id,
    },
    Denied,
}

/// SETTLE's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleStatus {
    Settled,
    Late,
    Duplicate,
}

/// ROLLBACK's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RollbackStatus {
    RolledBack,
    Duplicate,
    Expired,
}

/// A budget: one key's ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub(crate) settings: Settings,
    pub(crate) used: i64,
    /// Sum of pending amounts, expired-but-unreleased included.
    pub(crate) reserved: i64,
    pub(crate) overrun: i64,
    /// Latest time applied to this key: time never goes backwards for a key.
    pub(crate) clock_ms: i64,
    /// Last stream-style id seen or generated.
    pub(crate) last_id: StreamId,
    pub(crate) book: Book,
    /// Calendar period (`PeriodKind::None`: no resets).
    pub(crate) period: Period,
    /// Bounds of the period `used` belongs to.
    pub(crate) period_bounds: Option<(i64, i64)>,
    /// Where every change of `used` is logged (`None`: not logged).
    pub(crate) usage: Option<UsageLog>,
    /// Where the shell last indexed this budget for active expiry (runtime only).
    pub(crate) index_tag: IndexTag,
}

/// A note the Redis shell keeps on a budget: in which epoch of its expiry index it indexed the
/// budget's key, and at what due time (`None`: not indexed). It lets a write that leaves the
/// due time where the index has it skip the index (a hash of the key name and two lookups).
/// Opaque to the ledger: runtime only, never persisted, ignored by `==`, and not copied by
/// `clone` (a copy lives under another key, so it starts with no note: epoch 0).
#[derive(Debug, Default)]
pub struct IndexTag(std::cell::Cell<(u64, Option<i64>)>);

impl IndexTag {
    /// `(epoch, indexed due time)`; epoch 0: never indexed.
    pub fn get(&self) -> (u64, Option<i64>) {
        self.0.get()
    }

    /// Records that the key was indexed in `epoch` with due time `due` (unix ms).
    pub fn set(&self, epoch: u64, due: Option<i64>) {
        self.0.set((epoch, due));
    }
}

impl Clone for IndexTag {
    fn clone(&self) -> Self {
        IndexTag::default()
    }
}

impl PartialEq for IndexTag {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for IndexTag {}

fn add(a: i64, b: i64) -> Result<i64, LedgerError> {
    a.checked_add(b).ok_or(LedgerError::Overflow)
}

fn sub(a: i64, b: i64) -> Result<i64, LedgerError> {
    a.checked_sub(b).ok_or(LedgerError::Overflow)
}

impl Budget {
    /// An empty budget created at `at_ms` with `settings`; `used` = 0.
    pub fn new(settings: Settings, at_ms: i64) -> Self {
        let mut book = Book::default();
        book.set_unit(settings.unit_ms);
        Budget {
            settings,
            used: 0,
            reserved: 0,
            overrun: 0,
            clock_ms: at_ms,
            last_id: StreamId::ZERO,
            book,
            period: Period::none(),
            period_bounds: None,
            usage: None,
            index_tag: IndexTag::default(),
        }
    }

    /// The usage log (`None`: off).
    pub fn usage(&self) -> Option<&UsageLog> {
        self.usage.as_ref()
    }

    /// `used` as stored (physical: the period it belongs to may have ended; see
    /// [`Budget::view`] for the logical value). The usage log reports it after each effect.
    pub fn stored_used(&self) -> i64 {
        self.used
    }

    /// The stored bounds of the period `used` belongs to (`None` without a period).
    pub fn stored_bounds(&self) -> Option<(i64, i64)> {
        self.period_bounds
    }

    /// QUOTA.SET ... STREAM: the effect that sets the usage log to `log`, `None` if it already
    /// is that.
    pub fn plan_usage(&self, log: Option<UsageLog>) -> Result<Option<Effect>, LedgerError> {
        if let Some(l) = &log {
            l.validate()?;
        }
        Ok((log != self.usage).then_some(Effect::Usage { log }))
    }

    /// The shell's note of where it indexed this budget (see [`IndexTag`]).
    pub fn index_tag(&self) -> &IndexTag {
        &self.index_tag
    }

    /// The key's clock (unix ms): the latest time a command's own effect was applied at, or
    /// a released reservation's deadline if later; a forget does not move it.
    pub fn clock_ms(&self) -> i64 {
        self.clock_ms
    }

    /// The calendar period (`PeriodKind::None`: `used` never resets).
    pub fn period(&self) -> &Period {
        &self.period
    }

    /// Has the period `used` belongs to ended by `now`, with a next period to reset into?
    /// A next period that cannot be computed (past year 9999) means no reset: reads, plans
    /// and the Reset effect must agree, so all three go through here.
    fn period_ended(&self, now: i64) -> bool {
        matches!(self.period_bounds, Some((_, end)) if now >= end)
            && matches!(self.period.bounds(now), Ok(Some(_)))
    }

    /// The period containing `now`: the stored bounds while they hold, else computed.
    pub fn current_bounds(&self, now: i64) -> Result<Option<(i64, i64)>, LedgerError> {
        if self.period.is_none() {
            // The common case, asked on every view (bounds are None too: an invariant).
            return Ok(None);
        }
        match self.period_bounds {
            Some((start, end)) if now >= start && now < end => Ok(Some((start, end))),
            _ => self.period.bounds(now).map_err(period_error),
        }
    }

    /// `used` as of `now`: 0 once the period it belongs to has ended.
    fn used_at(&self, now: i64) -> i64 {
        if self.period_ended(now) {
            0
        } else {
            self.used
        }
    }

    /// A denied RESERVE or CHARGE of `amount`: ms until the period ends if the amount would fit
    /// in a fresh period (used = 0, reservations still held), else −1.
    pub fn retry_after(&self, now: i64, amount: i64) -> i64 {
        self.retry_after_keep(now, amount, None)
    }

    /// [`Budget::retry_after`] of a call with `KEEP keep`: the fresh period must also leave
    /// `keep` available after the grant.
    pub fn retry_after_keep(&self, now: i64, amount: i64, keep: Option<i64>) -> i64 {
        let Ok(Some((_, end))) = self.current_bounds(now) else {
            return -1;
        };
        let view = self.view(now);
        // Widened from i64: cannot saturate.
        let room = i128::from(view.limit).saturating_sub(i128::from(view.reserved));
        let fresh = room.saturating_add(i128::from(view.overdraft));
        let kept = keep.is_none_or(|k| room.saturating_sub(i128::from(amount)) >= i128::from(k));
        if i128::from(amount) <= fresh && kept {
            end.saturating_sub(now).max(0)
        } else {
            -1
        }
    }

    /// LIMIT, OVERDRAFT, MAXRESERVE and the default TTL, as last configured.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The pending reservations and remembered finished ids (read-only).
    pub fn book(&self) -> &Book {
        &self.book
    }

    /// The key's clock: the time a command at wall time `wall_ms` runs at.
    pub fn now(&self, wall_ms: i64) -> i64 {
        wall_ms.max(self.clock_ms)
    }

    /// Sum and count of expired-but-unreleased reservations at `now`: none without a search
    /// while the soonest deadline is ahead (the usual case), else one O(log n) descent of the
    /// deadline index, however many there are.
    fn unreleased_expired(&self, now: i64) -> (i64, i64) {
        if self.book.first_deadline().is_none_or(|d| d > now) {
            return (0, 0);
        }
        let expired = self.book.expired(now);
        (
            // A sum of pending amounts: at most `reserved`, a valid i64.
            expired.amount,
            i64::try_from(expired.count).unwrap_or(i64::MAX),
        )
    }

    /// The start of the period containing `now` (`None` without a period).
    fn period_start(&self, now: i64) -> Option<i64> {
        self.current_bounds(now)
            .unwrap_or(self.period_bounds)
            .map(|(start, _)| start)
    }

    /// What the expiry of `r` charges when released at `now`: by the budget's `ONEXPIRE`, and
    /// nothing if its deadline lies before the period containing `now` (the usage of that
    /// period has been reset: a swept and an unswept key must agree).
    fn expiry_charge(&self, r: &Reservation, now: i64) -> i64 {
        if self.period_start(now).is_some_and(|s| r.deadline_ms < s) {
            return 0;
        }
        match self.settings.on_expire {
            OnExpire::Release => 0,
            OnExpire::Charge => r.amount,
            OnExpire::Elapsed => r.elapsed_charge(self.settings.unit_ms.unwrap_or(0)),
        }
    }

    /// The effect that releases expired reservation `id` (`r`) at `now`.
    fn release_of(&self, id: &[u8], r: &Reservation, now: i64) -> Effect {
        Effect::Release {
            id: Id::from_slice(id),
            on_expire: self.settings.on_expire,
            charge: self.expiry_charge(r, now),
        }
    }

    /// What the expired-but-unreleased reservations at `now` charge, summed in O(log n) like
    /// their amounts: those whose deadline lies in the period containing `now`.
    fn unreleased_charges(&self, now: i64) -> i64 {
        if self.settings.on_expire == OnExpire::Release
            || self.book.first_deadline().is_none_or(|d| d > now)
        {
            return 0;
        }
        let mut sum = self.book.expired(now);
        if let Some(start) = self.period_start(now) {
            sum = sum.minus(self.book.expired(start.saturating_sub(1)));
        }
        match self.settings.on_expire {
            OnExpire::Release => 0,
            OnExpire::Charge => sum.amount,
            OnExpire::Elapsed => sum.elapsed,
        }
    }

    /// The logical numbers at `now`.
    pub fn view(&self, now: i64) -> View {
        let (expired_sum, expired_count) = self.unreleased_expired(now);
        let reserved = self.reserved.saturating_sub(expired_sum).max(0);
        let fresh = self.period_ended(now);
        // Expiry charges move from reserved to used: the sum stays within i64.
        let used = if fresh { 0 } else { self.used }.saturating_add(self.unreleased_charges(now));
        let pending = i64::try_from(self.book.pending_len())
            .unwrap_or(i64::MAX)
            .saturating_sub(expired_count);
        View {
            limit: self.settings.limit,
            used,
            reserved,
            // used + reserved <= i64::MAX and limit >= 0, so this cannot overflow; saturate anyway.
            available: self
                .settings
                .limit
                .saturating_sub(used)
                .saturating_sub(reserved),
            overdraft: self.settings.overdraft,
            max_reserve: self.settings.max_reserve,
            default_ttl_ms: self.settings.default_ttl_ms,
            pending,
            overrun: if fresh { 0 } else { self.overrun },
            period_bounds: self.current_bounds(now).unwrap_or(self.period_bounds),
        }
    }

    /// The logical state of `id` at `now` with finished ids kept for `keep_ms`.
    pub fn id_state(&self, id: &[u8], now: i64, keep_ms: i64) -> IdState {
        self.id_lookup(id, now, keep_ms).0
    }

    /// [`Budget::id_state`], and whether the id is still in the book: an id that is not needs
    /// no preparation before it is used (one search instead of two).
    fn id_lookup(&self, id: &[u8], now: i64, keep_ms: i64) -> (IdState, bool) {
        let entry = self.book.get(id);
        let state = match entry {
            None => IdState::Unknown,
            Some(Entry::Pending(r)) => {
                if now < r.deadline_ms {
                    IdState::Pending(r)
                } else if now >= r.deadline_ms.saturating_add(keep_ms) {
                    IdState::Unknown
                } else {
                    IdState::Expired {
                        amount: r.amount,
                        charged: self.expiry_charge(&r, now),
                        deadline_ms: r.deadline_ms,
                        unreleased: true,
                    }
                }
            }
            Some(Entry::Finished(f)) => {
                if now >= f.finished_ms.saturating_add(keep_ms) {
                    IdState::Unknown
                } else if let Outcome::Expired { amount, charged } = f.outcome {
                    IdState::Expired {
                        amount,
                        charged,
                        deadline_ms: f.finished_ms,
                        unreleased: false,
                    }
                } else {
                    IdState::Done(f.outcome)
                }
            }
        };
        (state, entry.is_some())
    }

    /// Effects that bring `id`'s physical entry in line with its logical state (release an
    /// expired reservation, forget a stale id) before a command acts on it.
    fn prepare_id(&self, id: &[u8], now: i64, keep_ms: i64, effects: &mut Effects) {
        let (release, forget) = match self.book.get(id) {
            None => (None, false),
            Some(Entry::Pending(r)) => (
                (now >= r.deadline_ms).then(|| self.release_of(id, &r, now)),
                now >= r.deadline_ms.saturating_add(keep_ms),
            ),
            Some(Entry::Finished(f)) => (None, now >= f.finished_ms.saturating_add(keep_ms)),
        };
        if let Some(release) = release {
            effects.push(release);
        }
        if forget {
            effects.push(Effect::Forget {
                id: Id::from_slice(id),
            });
        }
    }

    /// The bounded cleanup a write carries (as [`Budget::upkeep`] plans it, without the
    /// period reset or an id's preparation): release expired reservations and forget stale
    /// finished ids, at most [`MAINTENANCE_BATCH`] of each, skipping `skip`. For the reference
    /// model's checks (tests/ledger_model.rs).
    pub fn maintenance(&self, now: i64, keep_ms: i64, skip: Option<&[u8]>) -> Effects {
        self.cleanup(now, keep_ms, skip, MAINTENANCE_BATCH)
    }

    /// The active sweeper's work on this key: release expired reservations and forget stale
    /// ids, soonest first, at most `max` effects in all (so the sweeper's effort bounds its
    /// forgets too). Any prefix of the cleanup is a valid plan: the rest comes due again.
    pub fn plan_sweep(&self, now: i64, keep_ms: i64, max: usize) -> Effects {
        let mut effects = self.cleanup(now, keep_ms, None, max);
        effects.truncate(max);
        // A charging expiry goes to the period containing its deadline: once a boundary has
        // passed, the sweep resets first, as a write would (the charge must not land in the
        // ended period's usage, which the reset then drops).
        let charges = effects
            .iter()
            .any(|e| matches!(e, Effect::Release { charge, .. } if *charge > 0));
        if charges && self.period_ended(now) {
            if let Ok(Some((start_ms, end_ms))) = self.current_bounds(now) {
                effects.insert(0, Effect::Reset { start_ms, end_ms });
            }
        }
        effects
    }

    /// When this key next has cleanup due: the soonest deadline, or the soonest time a
    /// finished id is to be forgotten. `None` if nothing is pending or remembered.
    pub fn next_due(&self, keep_ms: i64) -> Option<i64> {
        let deadline = self.book.first_deadline();
        let forget = self.book.first_finish().map(|f| f.saturating_add(keep_ms));
        match (deadline, forget) {
            (Some(d), Some(f)) => Some(d.min(f)),
            (d, f) => d.or(f),
        }
    }

    fn cleanup(&self, now: i64, keep_ms: i64, skip: Option<&[u8]>, max: usize) -> Effects {
        let mut effects = Effects::new();
        self.cleanup_into(now, keep_ms, skip, max, &mut effects);
        effects
    }

    /// [`Budget::cleanup`] appending to `effects`.
    fn cleanup_into(
        &self,
        now: i64,
        keep_ms: i64,
        skip: Option<&[u8]>,
        max: usize,
        effects: &mut Effects,
    ) {
        // The iterators are only made when something is due (making one costs a descent).
        if self.book.first_deadline().is_some_and(|d| d <= now) {
            for (deadline, id) in self.book.by_deadline().take(max) {
                if deadline > now {
                    break;
                }
                if skip == Some(id) {
                    continue;
                }
                let release = match self.settings.on_expire {
                    // No charge to compute: no lookup of the reservation.
                    OnExpire::Release => Effect::Release {
                        id: Id::from_slice(id),
                        on_expire: OnExpire::Release,
                        charge: 0,
                    },
                    _ => match self.book.get(id) {
                        Some(Entry::Pending(r)) => self.release_of(id, &r, now),
                        _ => continue,
                    },
                };
                effects.push(release);
                if now >= deadline.saturating_add(keep_ms) {
                    effects.push(Effect::Forget {
                        id: Id::from_slice(id),
                    });
                }
            }
        }
        let forgets = self
            .book
            .first_finish()
            .is_some_and(|f| now >= f.saturating_add(keep_ms));
        if forgets {
            for (finished, id) in self.book.by_finish().take(max) {
                if now < finished.saturating_add(keep_ms) {
                    break;
                }
                if skip == Some(id) {
                    continue;
                }
                effects.push(Effect::Forget {
                    id: Id::from_slice(id),
                });
            }
        }
    }

    /// Checks that the logical `used + reserved - minus + plus` stays within i64 (else
    /// `Overflow`), and says whether the physical state, which may still hold expired
    /// reservations beyond one write's maintenance batch, needs all of them released first
    /// (`physical_minus`: what the command itself takes out of the physical `reserved`).
    /// Decisions must never depend on whether cleanup was written.
    fn check_range(
        &self,
        now: i64,
        view: &View,
        minus: i64,
        physical_minus: i64,
        plus: i64,
    ) -> Result<bool, LedgerError> {
        add(sub(add(view.used, view.reserved)?, minus)?, plus)?;
        let physical = add(self.used_at(now), self.reserved)
            .and_then(|t| sub(t, physical_minus))
            .and_then(|t| add(t, plus));
        Ok(physical.is_err())
    }

    /// Command effects preceded by the preparation of `prepare` (`None`: none, or an id known
    /// to be new) and the maintenance, which leaves `skip` out: bounded, or every expired
    /// reservation when `full` (see [`Budget::check_range`]).
    fn upkeep(
        &self,
        now: i64,
        keep_ms: i64,
        prepare: Option<&[u8]>,
        skip: Option<&[u8]>,
        full: bool,
        command: Effects,
    ) -> Effects {
        // Usually nothing comes before the command's own effects: no new vector then.
        let mut effects = Effects::new();
        if self.period_ended(now) {
            if let Ok(Some((start_ms, end_ms))) = self.current_bounds(now) {
                effects.push(Effect::Reset { start_ms, end_ms });
            }
        }
        if let Some(id) = prepare {
            self.prepare_id(id, now, keep_ms, &mut effects);
        }
        let batch = if full { usize::MAX } else { MAINTENANCE_BATCH };
        self.cleanup_into(now, keep_ms, skip, batch, &mut effects);
        if effects.is_empty() {
            return command;
        }
        effects.extend(command);
        effects
    }

    /// Calls `out(address, bytes)` for memory below the budget's own struct that a grant is
    /// about to read (index roots, the slab's tail), read from the struct alone. For
    /// prefetching: a multi-key command asks for every key's before working on the first, so
    /// that their cache misses overlap instead of coming one after another. Addresses only:
    /// nothing is read through them here.
    pub fn hot_addresses(&self, out: &mut impl FnMut(*const u8, usize)) {
        self.book.hot_addresses(out);
    }

    /// Next generated id at `now`: stream-style `<ms>-<seq>`, strictly greater than any
    /// stream-style id this key has seen, so ids stay unique across restarts and failovers.
    pub(crate) fn next_id(&self, now: i64) -> Result<Id, LedgerError> {
        let mut candidate = self.last_id.next(now).ok_or(NO_ID_LEFT)?;
        // Only client ids planted ahead of the clock can collide: skip them, bounded. An id
        // above every known id (the usual case: generated ids arrive in order) is answered by
        // the book's bound, without a search.
        for _ in 0..1024 {
            let id = candidate.to_bytes();
            if self.book.get(&id).is_none() {
                return Ok(id);
            }
            candidate = candidate.next(now).ok_or(NO_ID_LEFT)?;
        }
        Err(LedgerError::Invalid("could not generate a fresh id"))
    }

    /// Checks an amount against MAXRESERVE.
    fn check_max(&self, amount: i64) -> Result<(), LedgerError> {
        match self.settings.max_reserve {
            Some(max) if amount > max => Err(LedgerError::TooLarge { amount, max }),
            _ => Ok(()),
        }
    }

    /// Does `amount` fit in `available + overdraft` at `view`?
    fn fits(view: &View, amount: i64) -> bool {
        // available >= -i64::MAX and overdraft >= 0: widen to avoid any overflow.
        i128::from(amount) <= i128::from(view.available).saturating_add(i128::from(view.overdraft))
    }

    /// [`Budget::fits`], and with `KEEP keep` also `available - amount >= keep` (the headroom
    /// kept for calls without KEEP; the overdraft is not headroom).
    fn fits_keeping(view: &View, amount: i64, keep: Option<i64>) -> bool {
        Self::fits(view, amount)
            && keep.is_none_or(|k| {
                i128::from(view.available).saturating_sub(i128::from(amount)) >= i128::from(k)
            })
    }

    fn check_keep(keep: Option<i64>) -> Result<(), LedgerError> {
        if keep.is_some_and(|k| k < 0) {
            return Err(LedgerError::Invalid("KEEP must not be negative"));
        }
        Ok(())
    }

    /// QUOTA.SET creating a key at `now`: the effect that configures a fresh budget.
    pub fn plan_create(
        now: i64,
        settings: Settings,
        used: i64,
        period: Period,
    ) -> Result<Effect, LedgerError> {
        validate_settings(&settings)?;
        if used < 0 {
            return Err(LedgerError::Invalid("USED must not be negative"));
        }
        let bounds = period.bounds(now).map_err(period_error)?;
        Ok(Effect::Configure {
            settings: Box::new(settings),
            used,
            period: Box::new(period),
            bounds,
        })
    }

    /// QUOTA.SET on an existing key. `used` overwrites used when given. A changed period takes
    /// effect at once: the period containing `now` under the new rule begins, and the `used`
    /// counted so far is carried into it (nothing is forgiven by changing the calendar).
    /// Effects: the write's upkeep (a `Reset` after a boundary, cleanup) then one `Configure`;
    /// none at all when nothing would change.
    pub fn plan_configure(
        &self,
        now: i64,
        policy: &Policy,
        settings: Settings,
        used: Option<i64>,
        period: Option<Period>,
    ) -> Result<Plan<()>, LedgerError> {
        validate_settings(&settings)?;
        if used.is_some_and(|u| u < 0) {
            return Err(LedgerError::Invalid("USED must not be negative"));
        }
        let view = self.view(now);
        let used = used.unwrap_or(view.used);
        // Expired reservations are charged by the policy in force when they expired: under a
        // charging policy, or when the policy or unit changes, every one is released (with its
        // charge) before the new settings apply, so none is charged by rules set after its
        // expiry and `used` is exact when USED overwrites it. O(expired) for this SET only.
        let policy_moves = self.settings.on_expire != OnExpire::Release
            || settings.on_expire != self.settings.on_expire
            || settings.unit_ms != self.settings.unit_ms;
        let full = self.check_range(now, &view, view.used, 0, used)? || policy_moves;
        let period = period.unwrap_or_else(|| self.period.clone());
        let bounds = if period == self.period {
            self.current_bounds(now)?
        } else {
            period.bounds(now).map_err(period_error)?
        };
        // Nothing to change as a read sees it (e.g. `QUOTA.SET key` with no options, also just
        // after a boundary, where the reset is still only logical): no effects, as for any
        // command that changes nothing, so nothing is replicated, written or published. The
        // bounds then are the current ones (same period rule).
        if settings == self.settings && used == view.used && period == self.period {
            return Ok(Plan {
                effects: Effects::new(),
                reply: (),
            });
        }
        let configure = Effect::Configure {
            settings: Box::new(settings),
            used,
            period: Box::new(period),
            bounds,
        };
        // The first write after a boundary resets first, as every write does (the configure
        // effect would set used and bounds by itself, but the reset is what replicas, the AOF
        // and `quota.reset` subscribers see for every other write).
        let effects = self.upkeep(now, policy.keep_ms, None, None, full, smallvec![configure]);
        Ok(Plan { effects, reply: () })
    }

    /// QUOTA.RESERVE: grant iff `amount <= available + overdraft`.
    pub fn plan_reserve(
        &self,
        now: i64,
        policy: &Policy,
        amount: i64,
        id: Option<&[u8]>,
        ttl_ms: Option<i64>,
    ) -> Result<Plan<ReserveReply>, LedgerError> {
        self.plan_reserve_keep(now, policy, amount, id, ttl_ms, None)
    }

    /// QUOTA.RESERVE with `KEEP keep` (`None`: without): grant iff `amount <= available +
    /// overdraft` and, with KEEP, `available - amount >= keep`. Errors: `keep < 0` and those
    /// of [`Budget::plan_reserve`].
    // Inlined: its result, returned through memory, stalled MRESERVE (docs/benchmarks.md).
    #[inline(always)]
    pub fn plan_reserve_keep(
        &self,
        now: i64,
        policy: &Policy,
        amount: i64,
        id: Option<&[u8]>,
        ttl_ms: Option<i64>,
        keep: Option<i64>,
    ) -> Result<Plan<ReserveReply>, LedgerError> {
        if amount < 0 {
            return Err(LedgerError::Invalid("amount must not be negative"));
        }
        Self::check_keep(keep)?;
        let mut present = false;
        if let Some(id) = id {
            let (state, in_book) = self.id_lookup(id, now, policy.keep_ms);
            present = in_book;
            match state {
                IdState::Unknown => {}
                IdState::Pending(r) if r.amount == amount => {
                    return Ok(Plan {
                        effects: Effects::new(),
                        reply: ReserveReply::Retried {
                            id: Id::from_slice(id),
                        },
                    })
                }
                IdState::Pending(_) => {
                    return Err(conflict(id, "pending", "pending with a different amount"))
                }
                IdState::Expired { .. } => {
                    return Err(conflict(
                        id,
                        "expired",
                        "a finished id cannot be reserved again",
                    ))
                }
                IdState::Done(o) => {
                    return Err(conflict(
                        id,
                        o.state_name(),
                        "a finished id cannot be reserved again",
                    ))
                }
            }
        }
        self.check_max(amount)?;
        let view = self.view(now);
        if !Self::fits_keeping(&view, amount, keep) {
            return Ok(Plan {
                effects: Effects::new(),
                reply: ReserveReply::Denied,
            });
        }
        if view.pending >= policy.max_pending {
            return Err(LedgerError::TooManyPending {
                max: policy.max_pending,
            });
        }
        let ttl = ttl_ms.unwrap_or(self.settings.default_ttl_ms);
        if !(1..=MAX_TTL_MS).contains(&ttl) {
            return Err(BAD_TTL);
        }
        let deadline_ms = now.checked_add(ttl).ok_or(LedgerError::Invalid(
            "TTL too large: the deadline would overflow",
        ))?;
        let full = self.check_range(now, &view, 0, 0, amount)?;
        // A client id may still be physically there (logically forgotten): prepare it. A
        // generated id is known to be new.
        let (id, prepare): (Id, bool) = match id {
            Some(id) => (Id::from_slice(id), present),
            None => (self.next_id(now)?, false),
        };
        let grant = Effect::Grant {
            id: Id::from_slice(&id), // a memcpy; `clone` copies byte by byte
            amount,
            deadline_ms,
        };
        let effects = self.upkeep(
            now,
            policy.keep_ms,
            prepare.then_some(&id[..]),
            Some(&id),
            full,
            smallvec![grant],
        );
        Ok(Plan {
            effects,
            reply: ReserveReply::Granted { id },
        })
    }

    /// QUOTA.SETTLE: charge `actual` for reservation `id`. Reply: (status, charged).
    pub fn plan_settle(
        &self,
        now: i64,
        policy: &Policy,
        id: &[u8],
        actual: i64,
    ) -> Result<Plan<(SettleStatus, i64)>, LedgerError> {
        if actual < 0 {
            return Err(LedgerError::Invalid("actual must not be negative"));
        }
        let view = self.view(now);
        // A live pending id needs no preparation (nothing to release or forget).
        let (status, effect, full, prepare) = match self.id_state(id, now, policy.keep_ms) {
            IdState::Unknown => return Err(LedgerError::NoReservation { id: id.to_vec() }),
            IdState::Pending(r) => {
                let full = self.check_range(now, &view, r.amount, r.amount, actual)?;
                add(view.overrun, actual.saturating_sub(r.amount).max(0))?;
                (
                    SettleStatus::Settled,
                    Effect::Settle {
                        id: Id::from_slice(id),
                        actual,
                    },
                    full,
                    false,
                )
            }
            IdState::Expired {
                amount,
                charged,
                deadline_ms,
                unreleased,
            } => {
                let physical_minus = if unreleased { amount } else { 0 };
                // The range check counts the actual in full (an upper bound of what a late
                // settle after a charging expiry adds: see `late_used`).
                let full = self.check_range(now, &view, 0, physical_minus, actual)?;
                let in_period = self.period_start(now).is_none_or(|s| deadline_ms >= s);
                late_used(view.used, actual, charged, in_period)?;
                add(view.overrun, actual.saturating_sub(amount).max(0))?;
                // A charge to replace: every expired reservation is released first, so the
                // physical `used` the replacement starts from is the logical one.
                let full = full || charged > 0;
                (
                    SettleStatus::Late,
                    Effect::SettleLate {
                        id: Id::from_slice(id),
                        actual,
                    },
                    full,
                    true,
                )
            }
            IdState::Done(Outcome::Settled { actual: a, .. }) if a == actual => {
                return Ok(Plan {
                    effects: Effects::new(),
                    reply: (SettleStatus::Duplicate, a),
                })
            }
            IdState::Done(Outcome::Settled { .. }) => {
                return Err(conflict(
                    id,
                    "settled",
                    "already settled with another actual",
                ))
            }
            IdState::Done(o) => return Err(conflict(id, o.state_name(), "it cannot be settled")),
        };
        let effects = self.upkeep(
            now,
            policy.keep_ms,
            prepare.then_some(id),
            Some(id),
            full,
            smallvec![effect],
        );
        Ok(Plan {
            effects,
            reply: (status, actual),
        })
    }

    /// QUOTA.SETTLE key id ELAPSED: charge the time since the grant, measured by the key's
    /// clock (`now - created`), in the budget's unit, rounded up once. Reply as
    /// [`Budget::plan_settle`]; a retry of a settled id answers `duplicate` with the first
    /// charge. Errors: no UNIT (`ERR`), an expired reservation (`CONFLICT`: its start is not
    /// kept; settle it with an actual), and those of [`Budget::plan_settle`].
    pub fn plan_settle_elapsed(
        &self,
        now: i64,
        policy: &Policy,
        id: &[u8],
    ) -> Result<Plan<(SettleStatus, i64)>, LedgerError> {
        let unit = self.settings.unit_ms.ok_or(LedgerError::Invalid(
            "ELAPSED needs a budget with a UNIT (QUOTA.SET key UNIT ms|s|min)",
        ))?;
        match self.id_state(id, now, policy.keep_ms) {
            IdState::Pending(r) => {
                let actual = ceil_units(now.saturating_sub(r.created_ms), unit);
                self.plan_settle(now, policy, id, actual)
            }
            IdState::Done(Outcome::Settled { actual, .. }) => Ok(Plan {
                effects: Effects::new(),
                reply: (SettleStatus::Duplicate, actual),
            }),
            IdState::Expired { .. } => Err(conflict(
                id,
                "expired",
                "ELAPSED settles a pending reservation only (settle it with an actual)",
            )),
            // Unknown, rolled back, charged: the errors of any settle.
            _ => self.plan_settle(now, policy, id, 0),
        }
    }

    /// QUOTA.ROLLBACK: release reservation `id`. Reply: (status, released).
    pub fn plan_rollback(
        &self,
        now: i64,
        policy: &Policy,
        id: &[u8],
    ) -> Result<Plan<(RollbackStatus, i64)>, LedgerError> {
        let (status, released, command) = match self.id_state(id, now, policy.keep_ms) {
            IdState::Unknown => return Err(LedgerError::NoReservation { id: id.to_vec() }),
            IdState::Pending(r) => (
                RollbackStatus::RolledBack,
                r.amount,
                smallvec![Effect::Rollback {
                    id: Id::from_slice(id),
                }],
            ),
            IdState::Expired { .. } => (RollbackStatus::Expired, 0, Effects::new()),
            IdState::Done(Outcome::RolledBack { .. }) => {
                (RollbackStatus::Duplicate, 0, Effects::new())
            }
            IdState::Done(o) => {
                return Err(conflict(id, o.state_name(), "a rollback never un-charges"))
            }
        };
        // An expired or duplicate rollback only writes the pending cleanup of its own id.
        let effects = if command.is_empty() {
            let mut e = Effects::new();
            self.prepare_id(id, now, policy.keep_ms, &mut e);
            e
        } else {
            // Only a live pending id gets here: nothing of its own to prepare.
            self.upkeep(now, policy.keep_ms, None, Some(id), false, command)
        };
        Ok(Plan {
            effects,
            reply: (status, released),
        })
    }

    /// QUOTA.EXTEND: the pending reservation now expires at `now + ttl_ms`.
    pub fn plan_extend(
        &self,
        now: i64,
        policy: &Policy,
        id: &[u8],
        ttl_ms: i64,
    ) -> Result<Plan<i64>, LedgerError> {
        if !(1..=MAX_TTL_MS).contains(&ttl_ms) {
            return Err(BAD_TTL);
        }
        match self.id_state(id, now, policy.keep_ms) {
            IdState::Unknown => Err(LedgerError::NoReservation { id: id.to_vec() }),
            IdState::Pending(_) => {
                let deadline_ms = now.checked_add(ttl_ms).ok_or(LedgerError::Invalid(
                    "ttl_ms too large: the deadline would overflow",
                ))?;
                // A live pending id: nothing of its own to prepare.
                let effects = self.upkeep(
                    now,
                    policy.keep_ms,
                    None,
                    Some(id),
                    false,
                    smallvec![Effect::Extend {
                        id: Id::from_slice(id),
                        deadline_ms,
                    }],
                );
                Ok(Plan {
                    effects,
                    reply: ttl_ms,
                })
            }
            IdState::Expired { .. } => Err(conflict(id, "expired", "it can no longer be extended")),
            IdState::Done(o) => Err(conflict(id, o.state_name(), "it can no longer be extended")),
        }
    }

    /// QUOTA.CHARGE: one-phase check-and-deduct. Reply: charged?
    pub fn plan_charge(
        &self,
        now: i64,
        policy: &Policy,
        amount: i64,
        id: Option<&[u8]>,
        force: bool,
    ) -> Result<Plan<bool>, LedgerError> {
        self.plan_charge_keep(now, policy, amount, id, force, None)
    }

    /// QUOTA.CHARGE with `KEEP keep` (`None`: without; FORCE ignores it, as every limit):
    /// charged iff it fits as in [`Budget::plan_charge`] and, with KEEP, `available - amount
    /// >= keep`. Errors: `keep < 0` and those of [`Budget::plan_charge`].
    pub fn plan_charge_keep(
        &self,
        now: i64,
        policy: &Policy,
        amount: i64,
        id: Option<&[u8]>,
        force: bool,
        keep: Option<i64>,
    ) -> Result<Plan<bool>, LedgerError> {
        if amount < 0 {
            return Err(LedgerError::Invalid("amount must not be negative"));
        }
        Self::check_keep(keep)?;
        let mut present = false;
        if let Some(id) = id {
            let (state, in_book) = self.id_lookup(id, now, policy.keep_ms);
            present = in_book;
            match state {
                IdState::Unknown => {}
                IdState::Done(Outcome::Charged { amount: a }) if a == amount => {
                    return Ok(Plan {
                        effects: Effects::new(),
                        reply: true,
                    })
                }
                IdState::Done(Outcome::Charged { .. }) => {
                    return Err(conflict(id, "charged", "already charged another amount"))
                }
                IdState::Pending(_) => {
                    return Err(conflict(id, "pending", "the id belongs to a reservation"))
                }
                IdState::Expired { .. } => {
                    return Err(conflict(id, "expired", "the id belongs to a reservation"))
                }
                IdState::Done(o) => {
                    return Err(conflict(
                        id,
                        o.state_name(),
                        "the id belongs to a reservation",
                    ))
                }
            }
        }
        if !force {
            self.check_max(amount)?;
        }
        let view = self.view(now);
        if !force && !Self::fits_keeping(&view, amount, keep) {
            return Ok(Plan {
                effects: Effects::new(),
                reply: false,
            });
        }
        let full = self.check_range(now, &view, 0, 0, amount)?;
        // What goes beyond a non-negative available is overrun; its total stays in range too.
        let overrun = amount.saturating_sub(view.available.max(0)).max(0);
        add(view.overrun, overrun)?;
        let charge = Effect::Charge {
            amount,
            overrun,
            id: id.map(Id::from),
            forced: force,
        };
        // An id not in the book needs no preparation.
        let prepare = id.filter(|_| present);
        let effects = self.upkeep(now, policy.keep_ms, prepare, id, full, smallvec![charge]);
        Ok(Plan {
            effects,
            reply: true,
        })
    }

    /// Live pending reservations at `now`, soonest expiry first, at most `count`.
    pub fn pending(&self, now: i64, count: usize) -> Vec<PendingItem> {
        self.book
            .live_after(now)
            .take(count)
            .map(|(id, r)| PendingItem {
                id: Id::from_slice(id),
                amount: r.amount,
                age_ms: now.saturating_sub(r.created_ms).max(0),
                ttl_ms: r.deadline_ms.saturating_sub(now),
                start_ms: r.created_ms,
                heartbeat_ms: (r.heartbeat_ms != r.created_ms).then_some(r.heartbeat_ms),
            })
            .collect()
    }

    /// Applies one effect at `at_ms`. Validates before mutating: on error nothing changed.
    pub fn apply(&mut self, at_ms: i64, effect: &Effect) -> Result<(), LedgerError> {
        self.apply_seen(at_ms, effect, &mut ParsedId::default())
    }

    /// [`Budget::apply`], reading a granted or charged id through `ids`: the budgets of one
    /// multi-key write share one, and parse their common id once. The state reached is the
    /// same.
    pub fn apply_seen(
        &mut self,
        at_ms: i64,
        effect: &Effect,
        ids: &mut ParsedId,
    ) -> Result<(), LedgerError> {
        let at = at_ms.max(self.clock_ms);
        // Where the key's clock goes: to `at` for a command's own effect. Cleanup is not a
        // command: a release moves it only to the deadline it releases at (never back before
        // it, so a released reservation cannot come back), a forget not at all. Swept and
        // unswept keys therefore keep the same clock, whoever wrote the cleanup and when.
        let mut clock = at;
        match effect {
            Effect::Configure {
                settings,
                used,
                period,
                bounds,
            } => {
                validate_settings(settings)?;
                validate_bounds(*bounds)?;
                if *used < 0 {
                    return Err(LedgerError::BadEffect("negative used"));
                }
                if period.is_none() != bounds.is_none() {
                    return Err(LedgerError::BadEffect("period and bounds disagree"));
                }
                add(*used, self.reserved)?;
                if self.period_ended(at) {
                    // The old period is over: its overrun goes with it (used comes in the effect).
                    self.overrun = 0;
                }
                self.settings = **settings;
                self.used = *used;
                self.period = Period::clone(period);
                self.period_bounds = *bounds;
                self.book.set_unit(settings.unit_ms);
            }
            Effect::Reset { start_ms, end_ms } => {
                validate_bounds(Some((*start_ms, *end_ms)))?;
                if self.period.is_none() {
                    return Err(LedgerError::BadEffect("reset of a budget without a period"));
                }
                self.used = 0;
                self.overrun = 0;
                self.period_bounds = Some((*start_ms, *end_ms));
                // Not a command of its own (a write's own effect follows it; a sweep's reset
                // does not): the clock goes into the new period, no further.
                clock = (*start_ms).min(at);
            }
            Effect::Grant {
                id,
                amount,
                deadline_ms,
            } => {
                if *amount < 0 {
                    return Err(LedgerError::BadEffect("negative amount"));
                }
                // A master grants with a TTL of at least 1 ms: anything else is forged.
                if *deadline_ms <= at {
                    return Err(LedgerError::BadEffect("deadline not after the grant"));
                }
                let reserved = add(self.reserved, *amount)?;
                add(self.used, reserved)?;
                // The last check: refused (nothing changed) if the id is known.
                let fresh = self.book.insert(
                    id,
                    Entry::Pending(Reservation::new(*amount, at, *deadline_ms)),
                );
                if !fresh {
                    return Err(LedgerError::BadEffect("grant of a known id"));
                }
                self.reserved = reserved;
                self.see_id(id, at, ids);
            }
            Effect::Settle { id, actual } => {
                let (reserved, used, overrun) = (self.reserved, self.used, self.overrun);
                let mut after = (reserved, used, overrun);
                self.book.update(
                    id,
                    |e| {
                        let r = pending_of(e)?;
                        if *actual < 0 {
                            return Err(LedgerError::BadEffect("negative actual"));
                        }
                        let reserved = sub(reserved, r.amount)?;
                        let used = add(used, *actual)?;
                        add(used, reserved)?;
                        let beyond = actual.saturating_sub(r.amount).max(0);
                        after = (reserved, used, add(overrun, beyond)?);
                        Ok(finished(
                            Outcome::Settled {
                                actual: *actual,
                                late: false,
                            },
                            at,
                        ))
                    },
                    NOT_PENDING,
                )?;
                (self.reserved, self.used, self.overrun) = after;
            }
            Effect::SettleLate { id, actual } => {
                let (amount, charged, deadline) = match self.book.get(id) {
                    Some(Entry::Finished(Finished {
                        outcome: Outcome::Expired { amount, charged },
                        finished_ms,
                    })) => (amount, charged, finished_ms),
                    _ => return Err(LedgerError::BadEffect("late settle of a non-expired id")),
                };
                if *actual < 0 {
                    return Err(LedgerError::BadEffect("negative actual"));
                }
                let in_period = self
                    .period_bounds
                    .is_none_or(|(start, _)| deadline >= start);
                let used = late_used(self.used, *actual, charged, in_period)?;
                add(used, self.reserved)?;
                let overrun = add(self.overrun, actual.saturating_sub(amount).max(0))?;
                self.used = used;
                self.overrun = overrun;
                self.finish(
                    id,
                    Outcome::Settled {
                        actual: *actual,
                        late: true,
                    },
                    at,
                );
            }
            Effect::Rollback { id } => {
                self.unreserve(id, |r| (Outcome::RolledBack { amount: r.amount }, at))?;
            }
            Effect::Release {
                id,
                on_expire,
                charge,
            } => {
                if *charge < 0 || (*on_expire == OnExpire::Release && *charge != 0) {
                    return Err(LedgerError::BadEffect("bad expiry charge"));
                }
                // Finished at the deadline: swept and unswept expiries are remembered alike.
                let (reserved, used) = (self.reserved, self.used);
                let mut after = (reserved, used, at);
                self.book.update(
                    id,
                    |e| {
                        let r = pending_of(e)?;
                        if *charge > r.amount {
                            return Err(LedgerError::BadEffect("expiry charge above the amount"));
                        }
                        // used + reserved does not grow: the charge is at most the amount.
                        after = (sub(reserved, r.amount)?, add(used, *charge)?, r.deadline_ms);
                        Ok(finished(
                            Outcome::Expired {
                                amount: r.amount,
                                charged: *charge,
                            },
                            r.deadline_ms,
                        ))
                    },
                    NOT_PENDING,
                )?;
                let deadline;
                (self.reserved, self.used, deadline) = after;
                clock = deadline.min(at);
            }
            Effect::Extend { id, deadline_ms } => {
                self.book.update(
                    id,
                    |e| {
                        let mut r = pending_of(e)?;
                        r.deadline_ms = *deadline_ms;
                        // The step's time is the heartbeat (`ONEXPIRE ELAPSED` charges to it),
                        // never before the grant: a loaded value may hold a grant later than
                        // its key's clock (a damaged RDB or RESTORE payload that decoded).
                        r.heartbeat_ms = at.max(r.created_ms);
                        Ok(Entry::Pending(r))
                    },
                    NOT_PENDING,
                )?;
            }
            Effect::Charge {
                amount,
                overrun,
                id,
                ..
            } => {
                if *amount < 0 || *overrun < 0 {
                    return Err(LedgerError::BadEffect("negative charge"));
                }
                let used = add(self.used, *amount)?;
                add(used, self.reserved)?;
                let total_overrun = add(self.overrun, *overrun)?;
                if let Some(id) = id {
                    // The last check: refused (nothing changed) if the id is known.
                    let fresh = self.book.insert(
                        id,
                        Entry::Finished(Finished {
                            outcome: Outcome::Charged { amount: *amount },
                            finished_ms: at,
                        }),
                    );
                    if !fresh {
                        return Err(LedgerError::BadEffect("charge with a known id"));
                    }
                    self.see_id(id, at, ids);
                }
                self.used = used;
                self.overrun = total_overrun;
            }
            Effect::Usage { log } => {
                if let Some(l) = log {
                    l.validate()
                        .map_err(|_| LedgerError::BadEffect("bad usage stream"))?;
                }
                self.usage = log.clone();
            }
            Effect::Forget { id } => match self.book.get(id) {
                Some(Entry::Finished(_)) => {
                    self.book.remove(id);
                    clock = self.clock_ms;
                }
                _ => {
                    return Err(LedgerError::BadEffect(
                        "forget of an id that is not finished",
                    ))
                }
            },
        }
        self.clock_ms = self.clock_ms.max(clock);
        Ok(())
    }

    /// Raises the id generator past a stream-style id used at `at`, unless the id lies in the
    /// key's future: generated ids are never ahead of `max(at, last id)`, and a client id far
    /// ahead (`18446744073709551615-18446744073709551615`) must not exhaust the generator.
    /// A future client id that the clock later reaches is skipped by `next_id`.
    fn see_id(&mut self, id: &[u8], at: i64, ids: &mut ParsedId) {
        if let Some(sid) = ids.parse(id) {
            let horizon = u64::try_from(at).unwrap_or(0).max(self.last_id.ms);
            if sid.ms <= horizon {
                self.last_id = self.last_id.max(sid);
            }
        }
    }

    /// Ends pending reservation `id` without spending it (rollback, expiry): its amount leaves
    /// `reserved`, and it is remembered with the outcome and finish time `ended` gives.
    fn unreserve(
        &mut self,
        id: &[u8],
        ended: impl FnOnce(&Reservation) -> (Outcome, i64),
    ) -> Result<(), LedgerError> {
        let reserved = self.reserved;
        let mut after = reserved;
        self.book.update(
            id,
            |e| {
                let r = pending_of(e)?;
                after = sub(reserved, r.amount)?;
                let (outcome, finished_ms) = ended(&r);
                Ok(finished(outcome, finished_ms))
            },
            NOT_PENDING,
        )?;
        self.reserved = after;
        Ok(())
    }

    fn finish(&mut self, id: &Id, outcome: Outcome, finished_ms: i64) {
        self.book.put(id, finished(outcome, finished_ms));
    }

    /// Checks the ledger invariants; used after loading untrusted data and in tests. Errors:
    /// [`LedgerError::Corrupt`] naming the broken one.
    pub fn check_invariants(&self) -> Result<(), LedgerError> {
        self.check_invariants_inner().map_err(|e| match e {
            LedgerError::BadEffect(why) | LedgerError::Invalid(why) => LedgerError::Corrupt(why),
            LedgerError::Overflow => LedgerError::Corrupt("used + reserved out of range"),
            other => other,
        })
    }

    fn check_invariants_inner(&self) -> Result<(), LedgerError> {
        validate_settings(&self.settings)?;
        validate_bounds(self.period_bounds)?;
        if self.period.is_none() != self.period_bounds.is_none() {
            return Err(LedgerError::Corrupt("period and bounds disagree"));
        }
        if self.used < 0 || self.reserved < 0 || self.overrun < 0 {
            return Err(LedgerError::Corrupt("negative counter"));
        }
        add(self.used, self.reserved)?;
        if let Some(l) = &self.usage {
            l.validate()?;
        }
        let mut sum = 0i64;
        for (_, entry) in self.book.entries() {
            match entry {
                Entry::Pending(r) => {
                    if r.amount < 0 {
                        return Err(LedgerError::Corrupt("negative reservation"));
                    }
                    if r.heartbeat_ms < r.created_ms {
                        return Err(LedgerError::Corrupt("heartbeat before the start"));
                    }
                    sum = add(sum, r.amount)?;
                }
                Entry::Finished(Finished {
                    outcome: Outcome::Expired { amount, charged },
                    ..
                }) if charged < 0 || charged > amount => {
                    return Err(LedgerError::Corrupt("expiry charge outside 0..=amount"));
                }
                Entry::Finished(_) => {}
            }
        }
        if sum != self.reserved {
            return Err(LedgerError::Corrupt(
                "reserved differs from the pending sum",
            ));
        }
        Ok(())
    }
}

/// `used` after a late settle of `actual` for a reservation whose expiry charged `charged`:
/// the actual replaces the charge. If the charge is in the current period (`in_period`),
/// `used` moves by `actual - charged`, never below 0 (a refund when the actual is smaller);
/// if it was in a period already reset, only what the actual exceeds it by is added. With no
/// charge, `used + actual` as ever. Errors: `Overflow`.
fn late_used(used: i64, actual: i64, charged: i64, in_period: bool) -> Result<i64, LedgerError> {
    // Widened from i64: none of these can overflow an i128.
    let (u, a, c) = (i128::from(used), i128::from(actual), i128::from(charged));
    let after = if in_period {
        u.saturating_add(a).saturating_sub(c).max(0)
    } else {
        u.saturating_add(a.saturating_sub(c).max(0))
    };
    i64::try_from(after).map_err(|_| LedgerError::Overflow)
}

/// What an effect on a pending reservation finds when the id is not pending.
const NOT_PENDING: LedgerError = LedgerError::BadEffect("id is not pending");

fn pending_of(e: Entry) -> Result<Reservation, LedgerError> {
    match e {
        Entry::Pending(r) => Ok(r),
        Entry::Finished(_) => Err(NOT_PENDING),
    }
}

fn finished(outcome: Outcome, finished_ms: i64) -> Entry {
    Entry::Finished(Finished {
        outcome,
        finished_ms,
    })
}

fn validate_bounds(bounds: Option<(i64, i64)>) -> Result<(), LedgerError> {
    match bounds {
        Some((start, end)) if start >= end => Err(LedgerError::BadEffect("empty period")),
        _ => Ok(()),
    }
}

fn conflict(id: &[u8], state: &'static str, why: &'static str) -> LedgerError {
    LedgerError::Conflict {
        id: id.to_vec(),
        state,
        why,
    }
}

/// Validates settings from a command, an effect or a loaded value.
pub fn validate_settings(s: &Settings) -> Result<(), LedgerError> {
    if s.limit < 0 || s.overdraft < 0 {
        return Err(LedgerError::Invalid(
            "LIMIT and OVERDRAFT must not be negative",
        ));
    }
    if matches!(s.max_reserve, Some(m) if m < 0) {
        return Err(LedgerError::Invalid("MAXRESERVE must not be negative"));
    }
    if !(1..=MAX_TTL_MS).contains(&s.default_ttl_ms) {
        return Err(BAD_TTL);
    }
    if s.unit_ms
        .is_some_and(|u| !UNITS_MS.iter().any(|&(_, ms)| ms == u))
    {
        return Err(LedgerError::Invalid("UNIT must be ms, s or min"));
    }
    if s.on_expire == OnExpire::Elapsed && s.unit_ms.is_none() {
        return Err(LedgerError::Invalid(
            "ONEXPIRE ELAPSED needs a UNIT (ms, s or min)",
        ));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_effect_stays_small() {
        // Plans carry effects by value (a multi-key command one per key): QUOTA.SET's
        // settings and period are boxed so that the common effects set the size.
        assert!(std::mem::size_of::<Effect>() <= 64);
    }

    #[test]
    fn an_exhausted_id_generator_says_so() {
        let settings = Settings::plain(10, 0, None, 1000);
        let mut b = Budget::new(settings, 1);
        b.last_id = StreamId {
            ms: u64::MAX,
            seq: u64::MAX,
        };
        let err = b
            .plan_reserve(5, &Policy::default(), 1, None, None)
            .err()
            .unwrap();
        assert_eq!(err.to_string(), "ERR no id left to generate: pass ID");
    }

    /// A heartbeat is never before its grant, even when a value's grant is later than its
    /// clock (a damaged payload that decoded): the invariants hold after the EXTEND, so the
    /// value saves and loads again (found by `tests/fuzz_decoders.rs`).
    #[test]
    fn a_heartbeat_is_never_before_the_grant() {
        let mut b = Budget::new(Settings::plain(100, 0, None, 1000), 1_000);
        let grant = b
            .plan_reserve(5_000, &Policy::default(), 1, Some(b"r"), None)
            .unwrap();
        run(&mut b, 5_000, &grant.effects);
        b.clock_ms = 1_000;
        let extend = Effect::Extend {
            id: Id::from_slice(b"r"),
            deadline_ms: 9_000,
        };
        b.apply(2_000, &extend).unwrap();
        assert_eq!(b.check_invariants(), Ok(()));
        let Some(Entry::Pending(r)) = b.book.get(b"r") else {
            panic!("not pending");
        };
        assert_eq!(
            (r.created_ms, r.heartbeat_ms, r.deadline_ms),
            (5_000, 5_000, 9_000)
        );
    }

    /// Applies a plan's effects at `now`.
    fn run(b: &mut Budget, now: i64, effects: &[Effect]) {
        for e in effects {
            b.apply(now, e).unwrap();
        }
    }

    /// An expiry charge belongs to the period containing its deadline, whoever releases it
    /// and when: a write after the boundary, the sweeper (which resets first), or nobody yet.
    #[test]
    fn expiry_charges_land_in_the_period_of_their_deadline() {
        use crate::core::period::PeriodKind;
        let day = 86_400_000;
        let settings = Settings {
            on_expire: OnExpire::Charge,
            ..Settings::plain(1000, 0, None, 1000)
        };
        let period = Period::new(PeriodKind::Day, b"UTC", None).unwrap();
        let t0 = 10 * day;
        let mut b = Budget::new(settings, t0);
        run(
            &mut b,
            t0,
            &[Budget::plan_create(t0, settings, 0, period).unwrap()],
        );
        let p = Policy::default();
        let end = t0 + day;
        // Expires before midnight (its charge goes with the old day) and after (the new day).
        let before = b
            .plan_reserve(end - 500, &p, 100, Some(b"before"), Some(400))
            .unwrap();
        run(&mut b, end - 500, &before.effects);
        let after = b
            .plan_reserve(end - 400, &p, 7, Some(b"after"), Some(600))
            .unwrap();
        run(&mut b, end - 400, &after.effects);
        let now = end + 300;
        assert_eq!(b.view(end - 1).used, 100);
        let want = b.view(now);
        assert_eq!((want.used, want.reserved), (7, 0));
        // The sweeper resets first, then releases both; the state reads the same.
        let mut swept = b.clone();
        let sweep = swept.plan_sweep(now, p.keep_ms, 10);
        assert!(matches!(sweep.first(), Some(Effect::Reset { .. })));
        assert!(sweep.contains(&Effect::Release {
            id: Id::from_slice(b"before"),
            on_expire: OnExpire::Charge,
            charge: 0,
        }));
        run(&mut swept, now, &sweep);
        assert_eq!(swept.view(now), want);
        // A write after the boundary does the same in its upkeep.
        let mut written = b.clone();
        let charge = written.plan_charge(now, &p, 1, None, false).unwrap();
        run(&mut written, now, &charge.effects);
        assert_eq!(written.view(now).used, 8);
        run(&mut swept, now, &charge.effects[charge.effects.len() - 1..]);
        assert_eq!(swept, written);
        // A reservation charged in a day that has ended: a late settle adds only what its
        // actual exceeds that charge by (the closed day keeps its 100).
        let mut early = b.clone();
        let sweep = early.plan_sweep(end - 50, p.keep_ms, 10);
        run(&mut early, end - 50, &sweep);
        assert_eq!(early.view(end - 50).used, 100);
        let late = early.plan_settle(now, &p, b"before", 150).unwrap();
        run(&mut early, now, &late.effects);
        assert_eq!(early.view(now).used, 7 + 50);
        // A late settle replaces the 7 charged in this day by its actual.
        let late = written.plan_settle(now, &p, b"after", 2).unwrap();
        run(&mut written, now, &late.effects);
        assert_eq!(written.view(now).used, 3);
    }

    #[test]
    fn the_ttl_error_spells_the_bound() {
        assert!(BAD_TTL.to_string().ends_with(&format!(" {MAX_TTL_MS} ms")));
    }
}
