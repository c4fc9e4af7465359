//! Sliding-window rate limit behind
//! `QUOTA.WINDOW key limit window_ms [COST n] [PRECISION ms] [PEEK]`.
//! Pure: no Redis types; the shell parses, stores and replicates.
//!
//! # Model
//!
//! Time is integer unix milliseconds (`i64`), cut into buckets of
//! `precision_ms`: bucket `i` holds the milliseconds
//! `[i * precision_ms, (i + 1) * precision_ms - 1]`. Only non-empty buckets are
//! kept, oldest first, as `(index, summed cost)`.
//!
//! A call at `now` counts every bucket overlapping `(now - window_ms, now]`
//! (its last millisecond is `> now - window_ms`) and is admitted iff
//! `counted + cost <= limit`. Counting whole buckets treats each event as if
//! it happened at the end of its bucket, so it may deny slightly early but
//! never admits too much. `PRECISION 1` is an exact sliding log.
//!
//! A `now` earlier than the key's last recorded time is treated as that time
//! (time never goes backwards for a key). `retry_after_ms` and
//! `reset_after_ms` are measured from the caller's own `now`, so that calling
//! again at `now + retry_after_ms` is admitted even for a lagging clock.
//!
//! # Cost 0
//!
//! Allowed, and admitted iff `counted <= limit`: it only fails after the limit
//! was lowered below what is already counted, and then `retry_after_ms` is the
//! time until `counted <= limit` again. Recording it stores no bucket (it only
//! advances the key's time and drops expired buckets).
//!
//! # Parameter changes (limit, window and precision come with every call)
//!
//! * **limit**: applies at once; the history is untouched.
//! * **precision**: each held bucket is moved into the new bucket containing
//!   its last millisecond, clamped to the key's last time (so nothing lands in
//!   the future). Events only move later, which is conservative.
//! * **window**: the key keeps history for its *horizon*: the largest window it
//!   has recorded with, capped at 4096 x the current precision (the bucket
//!   budget). Shrinking, then growing back within the horizon, is exact.
//!   Growing past horizon `H` at time `T` cannot see history before `T - H`
//!   (it was dropped): for a call at `t` the limit then holds over
//!   `(max(t - window_ms, T - H), t]`, i.e. the larger window phases in over
//!   `window_ms - H` ms, as if the key had been created at `T - H`.
//!
//! # Guarantee
//!
//! Let `F` (the forget point) be the latest `s - horizon` over the key's
//! recorded calls `s`: everything admitted after `F` is still held. Every
//! admitted call at (normalised) time `t` with `limit` and `window_ms`
//! satisfies: the cost admitted in `(max(t - window_ms, F), t]`, this call
//! included, is `<= limit`. Unless the window grew past the horizon,
//! `F <= t - window_ms` and this is the exact sliding-log bound.
//! [`Window::empty_at_ms`] is when the newest bucket leaves the horizon, so
//! expiring the key then forgets nothing a window up to the horizon could
//! still count.
//!
//! # Memory and determinism
//!
//! At most `ceil(horizon / precision) + 1 <= 4097` buckets of 8 bytes (a `u32` offset from a
//! base index and a `u32` count; the counts widen to `i64`, 12 bytes a bucket, once one exceeds
//! `u32::MAX`), whatever the traffic;
//! their storage grows to at most that budget and is trimmed after a shrink.
//! [`Window::check`] is pure (PEEK, and the decision of a counting call);
//! [`Window::record`] is the deterministic effect of an admitted call, which a
//! replica applies without deciding again.

use std::collections::VecDeque;
use std::fmt;

use crate::core::book::Id;
use crate::core::error::LedgerError;
use crate::core::ledger::IndexTag;
use crate::core::remembered::{Entry, IdStatus, Remembered};

/// Most buckets one window may span: `ceil(window_ms / precision_ms) <= 4096`.
pub const MAX_BUCKETS: i64 = 4096;

/// Longest window a client may ask for, ms: the cap on a reservation's TTL
/// ([`crate::core::ledger::MAX_TTL_MS`], ~31 700 years), so that no client call makes a key
/// that never expires. Checked where a client's call is parsed, not on replicated or loaded
/// values (what an older version accepted keeps loading).
pub const MAX_WINDOW_MS: i64 = crate::core::ledger::MAX_TTL_MS;

/// [`MAX_BUCKETS`] as a `usize`.
const MAX_BUCKETS_USIZE: usize = 4096;

/// Buckets per window when PRECISION is omitted: precision is
/// `window_ms / 60` (integer division), at least 1 ms.
pub const DEFAULT_BUCKETS: i64 = 60;

/// Why a call or a loaded value was refused. `Display` is the Redis error
/// reply (starts with `"ERR "`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowError {
    /// `limit < 0`.
    NegativeLimit,
    /// `window_ms <= 0`.
    WindowNotPositive,
    /// `COST < 0`.
    NegativeCost,
    /// `PRECISION <= 0`.
    PrecisionNotPositive,
    /// `PRECISION > window_ms`.
    PrecisionAboveWindow,
    /// `ceil(window_ms / precision_ms) > 4096`.
    TooManyBuckets,
    /// A sum of costs would not fit in `i64`.
    Overflow,
    /// A loaded value breaks an invariant; names which.
    Corrupt(&'static str),
}

impl fmt::Display for WindowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NegativeLimit => f.write_str("ERR limit must not be negative"),
            Self::WindowNotPositive => f.write_str("ERR window_ms must be positive"),
            Self::NegativeCost => f.write_str("ERR COST must not be negative"),
            Self::PrecisionNotPositive => f.write_str("ERR PRECISION must be positive"),
            Self::PrecisionAboveWindow => f.write_str("ERR PRECISION must not exceed window_ms"),
            Self::TooManyBuckets => f.write_str(
                "ERR too many buckets: window_ms/PRECISION must be at most 4096 (raise PRECISION)",
            ),
            Self::Overflow => f.write_str("ERR overflow"),
            Self::Corrupt(what) => write!(f, "ERR corrupt window value: {what}"),
        }
    }
}

impl std::error::Error for WindowError {}

/// One call's arguments. Build with [`WindowParams::parse`]; [`Window::check`]
/// and [`Window::record`] validate again, so a hand-built value cannot panic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowParams {
    /// Most cost admitted in any window; `>= 0`.
    pub limit: i64,
    /// Window length, ms; `> 0`.
    pub window_ms: i64,
    /// Bucket width, ms; `1..=window_ms` with `ceil(window_ms / precision_ms) <= 4096`.
    pub precision_ms: i64,
    /// Cost of this call; `>= 0`.
    pub cost: i64,
}

impl WindowParams {
    /// Validates the command's arguments and applies the defaults: `cost` 1,
    /// `precision` `max(window_ms / 60, 1)` ms.
    ///
    /// # Errors
    ///
    /// [`WindowError::WindowNotPositive`], [`WindowError::NegativeLimit`],
    /// [`WindowError::NegativeCost`], [`WindowError::PrecisionNotPositive`],
    /// [`WindowError::PrecisionAboveWindow`], [`WindowError::TooManyBuckets`].
    pub fn parse(
        limit: i64,
        window_ms: i64,
        cost: Option<i64>,
        precision_ms: Option<i64>,
    ) -> Result<Self, WindowError> {
        let params = Self {
            limit,
            window_ms,
            precision_ms: precision_ms.unwrap_or_else(|| default_precision(window_ms)),
            cost: cost.unwrap_or(1),
        };
        params.validate()?;
        Ok(params)
    }

    /// Checks the bounds documented on the fields.
    ///
    /// # Errors
    ///
    /// The same as [`Self::parse`].
    pub fn validate(&self) -> Result<(), WindowError> {
        if self.window_ms <= 0 {
            return Err(WindowError::WindowNotPositive);
        }
        if self.limit < 0 {
            return Err(WindowError::NegativeLimit);
        }
        if self.cost < 0 {
            return Err(WindowError::NegativeCost);
        }
        check_precision(self.window_ms, self.precision_ms)
    }
}

/// What a call decides. Durations are ms from the caller's `now_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowDecision {
    /// From [`Window::check`]: whether `cost` fits. From [`Window::record`]:
    /// always true (the cost was counted).
    pub allowed: bool,
    /// `limit - counted`, never negative. Counted includes this call's cost
    /// only when it was recorded.
    pub remaining: i64,
    /// 0 when allowed; else the exact ms until enough buckets have left the
    /// window for `cost` to fit (no other traffic, same limit); -1 when
    /// `cost > limit` (never fits).
    pub retry_after_ms: i64,
    /// ms until everything counted has left the window; 0 if nothing is counted.
    pub reset_after_ms: i64,
}

/// Persisted state of one key. Serialized field order is the wire format.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// Window of the last recorded call, ms.
    window_ms: i64,
    /// Bucket width the buckets are indexed by, ms.
    precision_ms: i64,
    /// How far back history is kept, ms (see module doc).
    horizon_ms: i64,
    /// Latest time recorded, unix ms; earlier calls are moved up to it.
    last_ms: i64,
    /// Non-empty buckets, strictly increasing index.
    buckets: Buckets,
    /// The stored configuration and remembered ids, boxed so that a key made by
    /// `QUOTA.WINDOW` calls alone pays 8 bytes for them. Persisted from encoding 2 on (not in
    /// the v1 field order).
    #[serde(skip)]
    extras: Option<Box<Extras>>,
}

/// What a configured window key holds besides its buckets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Extras {
    /// Stored configuration (`QUOTA.SET key WINDOW ...`).
    config: Option<WindowConfig>,
    /// Reservation ids of multi-key reservations (`QUOTA.MRESERVE`), kept while their bucket
    /// is inside the window.
    ids: Remembered,
    /// Where the shell last indexed the key for forgetting its ids (runtime only, as a
    /// budget's: [`IndexTag`]).
    index_tag: IndexTag,
}

/// The ids of a window without extras.
static NO_IDS: Remembered = Remembered::EMPTY;

/// A window key's stored configuration (`QUOTA.SET key WINDOW limit window_ms [PRECISION ms]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowConfig {
    /// Most cost admitted in any window; `>= 0`.
    pub limit: i64,
    /// Window length, ms.
    pub window_ms: i64,
    /// Bucket width, ms (the default applied: `max(window_ms / 60, 1)`).
    pub precision_ms: i64,
}

impl WindowConfig {
    /// Validates a configuration (the rules of [`WindowParams::parse`]).
    ///
    /// # Errors
    ///
    /// As [`WindowParams::parse`].
    pub fn parse(
        limit: i64,
        window_ms: i64,
        precision_ms: Option<i64>,
    ) -> Result<Self, WindowError> {
        let p = WindowParams::parse(limit, window_ms, Some(0), precision_ms)?;
        Ok(Self {
            limit: p.limit,
            window_ms: p.window_ms,
            precision_ms: p.precision_ms,
        })
    }

    /// The parameters of a call with `cost` under this configuration.
    pub fn params(&self, cost: i64) -> WindowParams {
        WindowParams {
            limit: self.limit,
            window_ms: self.window_ms,
            precision_ms: self.precision_ms,
            cost,
        }
    }
}

/// A fully specified change of a window key beyond a plain counted call (multi-key admission):
/// what a master replicates, and what a replica or an AOF replay applies without deciding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WindowEffect {
    /// Stores a configuration (after recording nothing at its parameters: the buckets move to
    /// its precision and horizon, as a call with them would).
    Configure(WindowConfig),
    /// Counts `cost` now with `window_ms`/`precision_ms` and, if `id` is given, remembers it
    /// in the bucket counted.
    Count {
        window_ms: i64,
        precision_ms: i64,
        cost: i64,
        id: Option<Id>,
    },
    /// Corrects a pending id's count to `actual` (in its bucket) and marks it settled.
    Settle { id: Id, actual: i64 },
    /// Gives back what a pending id counted and marks it rolled back.
    Rollback { id: Id },
    /// Forgets the ids whose bucket left the window (the sweeper's; changes nothing a call
    /// would see).
    Forget,
}

/// What a window key does with one id of a multi-key command, decided by the `plan_id_*`
/// methods (pure).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdPlan {
    /// A new id that fits: count it. Carries the check before counting.
    Grant(WindowDecision),
    /// The id is pending with the same amount: nothing more is counted.
    Retried,
    /// Does not fit (the check says when it would).
    Denied(WindowDecision),
    /// A pending id: corrected by `delta` (settle) or given back `released` (rollback).
    Corrected { delta: i64 },
    /// Rolled back: `released` given back.
    RolledBack { released: i64 },
    /// Already settled with this actual, or already rolled back: nothing changes.
    Duplicate,
    /// Not remembered (its bucket left the window, or never counted here): nothing changes.
    Skipped,
}

/// Summed cost of bucket `index` (ms `[index * precision, (index + 1) * precision - 1]`).
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
struct Bucket {
    index: i64,
    count: i64,
}

/// A sequence of [`Bucket`]s, oldest first, stored in 8 bytes each (12 once a count does not
/// fit a `u32`, see [`Counts`]): bucket `i`
/// is `(base + offsets[i], counts[i])`. Any sequence whose indexes span at most
/// `u32::MAX` fits (a valid window's span at most 4097); order is not enforced
/// here (see [`Window::validate`]).
///
/// Serialized exactly as the `VecDeque<Bucket>` it replaces: a sequence of
/// `Bucket { index, count }`. Equality is of the bucket sequences (`base` is a
/// representation detail).
#[derive(Clone, Default)]
struct Buckets {
    /// Index that offsets are relative to: `<=` every held index. Moved only
    /// when a pushed index does not fit (or nothing is held).
    base: i64,
    /// `index - base` of each bucket. Same length as `counts`.
    offsets: VecDeque<u32>,
    counts: Counts,
    /// The sum of `counts`, kept by every change (derived: not serialized, not compared), so
    /// that a call's decision sums only the buckets on the short side of the window's edge.
    total: i128,
}

/// The buckets' counts: 4 bytes each while every count fits a `u32` (rate limits count
/// requests and tokens: practically always), 8 bytes once one does not.
#[derive(Clone)]
enum Counts {
    Narrow(VecDeque<u32>),
    Wide(VecDeque<i64>),
}

impl Default for Counts {
    fn default() -> Self {
        Counts::Narrow(VecDeque::new())
    }
}

impl Counts {
    fn with_capacity(n: usize) -> Counts {
        Counts::Narrow(VecDeque::with_capacity(n))
    }

    fn len(&self) -> usize {
        match self {
            Counts::Narrow(v) => v.len(),
            Counts::Wide(v) => v.len(),
        }
    }

    fn capacity(&self) -> usize {
        match self {
            Counts::Narrow(v) => v.capacity(),
            Counts::Wide(v) => v.capacity(),
        }
    }

    /// Bytes of one count in the current representation.
    fn width(&self) -> usize {
        match self {
            Counts::Narrow(_) => std::mem::size_of::<u32>(),
            Counts::Wide(_) => std::mem::size_of::<i64>(),
        }
    }

    /// Switches to 8-byte counts (same capacity).
    fn widen(&mut self) {
        if let Counts::Narrow(v) = self {
            let mut wide = VecDeque::with_capacity(v.capacity());
            wide.extend(v.iter().map(|&c| i64::from(c)));
            *self = Counts::Wide(wide);
        }
    }

    fn push_back(&mut self, count: i64) {
        if let Counts::Narrow(v) = self {
            match u32::try_from(count) {
                Ok(c) => return v.push_back(c),
                Err(_) => self.widen(),
            }
        }
        if let Counts::Wide(v) = self {
            v.push_back(count);
        }
    }

    fn pop_front(&mut self) {
        match self {
            Counts::Narrow(v) => {
                v.pop_front();
            }
            Counts::Wide(v) => {
                v.pop_front();
            }
        }
    }

    /// Sets the newest count (if any).
    fn set_back(&mut self, count: i64) {
        if let Counts::Narrow(v) = self {
            match u32::try_from(count) {
                Ok(c) => {
                    if let Some(newest) = v.back_mut() {
                        *newest = c;
                    }
                    return;
                }
                Err(_) => self.widen(),
            }
        }
        if let Counts::Wide(v) = self {
            if let Some(newest) = v.back_mut() {
                *newest = count;
            }
        }
    }

    /// Sets the count at position `i` (if any).
    fn set_at(&mut self, i: usize, count: i64) {
        if let Counts::Narrow(v) = self {
            match u32::try_from(count) {
                Ok(c) => {
                    if let Some(slot) = v.get_mut(i) {
                        *slot = c;
                    }
                    return;
                }
                Err(_) => self.widen(),
            }
        }
        if let Counts::Wide(v) = self {
            if let Some(slot) = v.get_mut(i) {
                *slot = count;
            }
        }
    }

    fn reserve_exact(&mut self, n: usize) {
        match self {
            Counts::Narrow(v) => v.reserve_exact(n),
            Counts::Wide(v) => v.reserve_exact(n),
        }
    }

    fn shrink_to_fit(&mut self) {
        match self {
            Counts::Narrow(v) => v.shrink_to_fit(),
            Counts::Wide(v) => v.shrink_to_fit(),
        }
    }

    fn iter(&self) -> CountsIter<'_> {
        match self {
            Counts::Narrow(v) => CountsIter::Narrow(v.iter()),
            Counts::Wide(v) => CountsIter::Wide(v.iter()),
        }
    }

    fn back(&self) -> Option<i64> {
        match self {
            Counts::Narrow(v) => v.back().map(|&c| i64::from(c)),
            Counts::Wide(v) => v.back().copied(),
        }
    }

    fn front(&self) -> Option<i64> {
        match self {
            Counts::Narrow(v) => v.front().map(|&c| i64::from(c)),
            Counts::Wide(v) => v.front().copied(),
        }
    }

    /// The sum of the counts at positions `range`.
    fn sum(&self, range: std::ops::Range<usize>) -> i128 {
        match self {
            Counts::Narrow(v) => v
                .range(range)
                .fold(0i128, |t, &c| t.saturating_add(i128::from(c))),
            Counts::Wide(v) => v
                .range(range)
                .fold(0i128, |t, &c| t.saturating_add(i128::from(c))),
        }
    }
}

#[derive(Clone)]
enum CountsIter<'a> {
    Narrow(std::collections::vec_deque::Iter<'a, u32>),
    Wide(std::collections::vec_deque::Iter<'a, i64>),
}

impl Iterator for CountsIter<'_> {
    type Item = i64;

    fn next(&mut self) -> Option<i64> {
        match self {
            CountsIter::Narrow(it) => it.next().map(|&c| i64::from(c)),
            CountsIter::Wide(it) => it.next().copied(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            CountsIter::Narrow(it) => it.size_hint(),
            CountsIter::Wide(it) => it.size_hint(),
        }
    }
}

impl ExactSizeIterator for CountsIter<'_> {}

impl Buckets {
    /// Holds `buckets` (in their order), in storage of exactly their number.
    ///
    /// # Errors
    ///
    /// [`WindowError::Corrupt`] if the indexes span more than `u32::MAX`.
    fn from_buckets<I>(buckets: I) -> Result<Self, WindowError>
    where
        I: Iterator<Item = Bucket> + Clone,
    {
        let span_err = WindowError::Corrupt("bucket index span");
        let mut len: usize = 0;
        let mut lowest: Option<i64> = None;
        let mut highest: Option<i64> = None;
        for b in buckets.clone() {
            len = len.saturating_add(1);
            lowest = Some(lowest.map_or(b.index, |l| l.min(b.index)));
            highest = Some(highest.map_or(b.index, |h| h.max(b.index)));
        }
        let base = lowest.unwrap_or(0);
        if let Some(high) = highest {
            offset(base, high).ok_or(span_err)?;
        }
        let mut out = Self {
            base,
            offsets: VecDeque::with_capacity(len),
            counts: Counts::with_capacity(len),
            total: 0,
        };
        for b in buckets {
            out.offsets
                .push_back(offset(base, b.index).ok_or(span_err)?);
            out.counts.push_back(b.count);
            out.total = out.total.saturating_add(i128::from(b.count));
        }
        Ok(out)
    }

    fn len(&self) -> usize {
        self.counts.len()
    }

    /// The index of the newest bucket (the greatest), if any.
    fn newest_index(&self) -> Option<i64> {
        self.offsets
            .back()
            .map(|&offset| self.base.saturating_add(i64::from(offset)))
    }

    /// The newest bucket (the greatest index), if any.
    fn newest(&self) -> Option<Bucket> {
        Some(Bucket {
            index: self.newest_index()?,
            count: self.counts.back()?,
        })
    }

    /// The index of the bucket at position `i` (oldest first).
    fn index_at(&self, i: usize) -> Option<i64> {
        self.offsets
            .get(i)
            .map(|&offset| self.base.saturating_add(i64::from(offset)))
    }

    /// Where the buckets reach index `first`: the position of the first bucket whose index is
    /// `>= first`, and the sum of the counts from there on. One binary search (over the stored
    /// offsets), then a sum over the shorter side (the whole is kept in `total`): under steady
    /// traffic the buckets that left the window since the last call, not the whole window.
    fn split_from(&self, first: i128) -> (usize, i128) {
        // Offsets grow with the index: compare them with `first`'s (none below: position 0).
        let first_offset = first.saturating_sub(i128::from(self.base));
        let mut lo = 0usize;
        if first_offset > 0 {
            match u32::try_from(first_offset) {
                // The oldest bucket is inside already (steady traffic: a record has just dropped
                // what left): no search.
                Ok(first_offset) if self.offsets.front().is_some_and(|&o| o >= first_offset) => {}
                Ok(first_offset) => {
                    let mut hi = self.len();
                    while lo < hi {
                        let mid = lo.saturating_add(hi.saturating_sub(lo) / 2);
                        match self.offsets.get(mid) {
                            Some(&offset) if offset >= first_offset => hi = mid,
                            _ => lo = mid.saturating_add(1),
                        }
                    }
                }
                // Above every offset.
                Err(_) => lo = self.len(),
            }
        }
        let len = self.len();
        let after = len.saturating_sub(lo);
        let sum = if lo <= after {
            self.total.saturating_sub(self.counts.sum(0..lo))
        } else {
            self.counts.sum(lo..len)
        };
        (lo, sum)
    }

    /// The buckets by value, oldest first.
    fn iter(&self) -> impl ExactSizeIterator<Item = Bucket> + Clone + '_ {
        let base = self.base;
        self.offsets
            .iter()
            .zip(self.counts.iter())
            .map(move |(&offset, count)| Bucket {
                // Exact: every offset was stored as `index - base` of an i64 index.
                index: base.saturating_add(i64::from(offset)),
                count,
            })
    }

    /// Drops the `expired` oldest buckets, then applies `add`. All or nothing.
    /// Storage grows by about 1/8 when full, never past `budget` buckets (the
    /// most a record can leave) unless more are held.
    ///
    /// # Errors
    ///
    /// [`WindowError::Corrupt`] if a pushed index and the buckets kept would
    /// span more than `u32::MAX` (not for a valid window: it spans at most
    /// 4097).
    fn advance(
        &mut self,
        expired: usize,
        add: Add,
        budget: Option<usize>,
    ) -> Result<(), WindowError> {
        let kept = self.len().saturating_sub(expired);
        let pushed = match add {
            Add::Push(b) if kept == 0 => Some((b.index, 0, b.count)),
            Add::Push(b) => match offset(self.base, b.index) {
                Some(off) => Some((self.base, off, b.count)),
                None => {
                    // Rare (an offset past u32::MAX, or below the base): rebuild
                    // around the kept buckets, leaving `self` as is on error.
                    let kept = self.iter().skip(expired).chain(std::iter::once(b));
                    *self = Self::from_buckets(kept)?;
                    return Ok(());
                }
            },
            _ => None,
        };
        // Nothing below can fail.
        for _ in 0..expired {
            let dropped = self.counts.front().unwrap_or(0);
            self.total = self.total.saturating_sub(i128::from(dropped));
            self.offsets.pop_front();
            self.counts.pop_front();
        }
        match add {
            Add::Nothing => {}
            Add::ToNewest(count) => self.set_newest(count),
            Add::Push(_) => {
                if let Some((base, off, count)) = pushed {
                    self.base = base;
                    self.reserve_one(budget);
                    self.offsets.push_back(off);
                    self.counts.push_back(count);
                    self.total = self.total.saturating_add(i128::from(count));
                }
            }
        }
        Ok(())
    }

    /// Sets the newest bucket's count (there is one), keeping `total`.
    fn set_newest(&mut self, count: i64) {
        let was = self.counts.back().unwrap_or(0);
        self.total = self
            .total
            .saturating_sub(i128::from(was))
            .saturating_add(i128::from(count));
        self.counts.set_back(count);
    }

    /// Room for one more bucket: when full, grows by `max(len / 8, 4)`, capped
    /// at `budget` (exact growth up to the budget a window can hold). At least 4: a window
    /// under traffic holds a number of buckets that moves up and down by a few, and growing it
    /// back one bucket at a time after a trim reallocated on one record in ten.
    fn reserve_one(&mut self, budget: Option<usize>) {
        let len = self.len();
        if self.offsets.capacity() > len && self.counts.capacity() > len {
            return;
        }
        let mut grow = (len / 8).max(4);
        if let Some(room) = budget.and_then(|b| b.checked_sub(len)) {
            grow = grow.min(room.max(1));
        }
        self.offsets.reserve_exact(grow);
        self.counts.reserve_exact(grow);
    }

    /// Returns spare storage after a shrink or conversion: keeps it when at most
    /// `len / 2 + CAPACITY_SLACK` buckets (so storage does not thrash).
    fn trim(&mut self) {
        let roomy = self
            .len()
            .saturating_add(self.len() / 2)
            .saturating_add(CAPACITY_SLACK);
        if self.offsets.capacity() > roomy {
            self.offsets.shrink_to_fit();
        }
        if self.counts.capacity() > roomy {
            self.counts.shrink_to_fit();
        }
    }

    /// Heap bytes of the storage (capacity, not length).
    #[cfg(test)]
    fn heap_bytes(&self) -> usize {
        let (offsets, counts) = self.allocations();
        offsets.saturating_add(counts)
    }

    /// The count of bucket `index` (0 if it holds nothing).
    fn count_of(&self, index: i64) -> i64 {
        match self.position(index) {
            Ok(i) => self.counts.iter().nth(i).unwrap_or(0),
            Err(_) => 0,
        }
    }

    /// `Ok(position)` of bucket `index`, or `Err(position)` where it would go.
    fn position(&self, index: i64) -> Result<usize, usize> {
        let (mut lo, mut hi) = (0usize, self.len());
        while lo < hi {
            let mid = lo.saturating_add(hi.saturating_sub(lo) / 2);
            match self.index_at(mid) {
                Some(i) if i < index => lo = mid.saturating_add(1),
                Some(i) if i == index => return Ok(mid),
                _ => hi = mid,
            }
        }
        Err(lo)
    }

    /// Adds `delta` to bucket `index`'s count, never below 0: a bucket left at 0 is removed,
    /// a missing one is inserted for a positive `delta`. All or nothing.
    ///
    /// # Errors
    ///
    /// [`WindowError::Overflow`] if the count or the total would pass `i64::MAX`;
    /// [`WindowError::Corrupt`] if an inserted index would not fit the storage's span.
    fn adjust(&mut self, index: i64, delta: i64) -> Result<(), WindowError> {
        let at = self.position(index);
        let was = match at {
            Ok(i) => self.counts.iter().nth(i).unwrap_or(0),
            Err(_) => 0,
        };
        let now = i128::from(was).saturating_add(i128::from(delta)).max(0);
        let now = i64::try_from(now).map_err(|_| WindowError::Overflow)?;
        let total = self
            .total
            .saturating_add(i128::from(now))
            .saturating_sub(i128::from(was));
        if total > i128::from(i64::MAX) {
            return Err(WindowError::Overflow);
        }
        match at {
            Ok(i) if now > 0 => {
                self.counts.set_at(i, now);
                self.total = total;
            }
            Err(_) if now == 0 => {}
            _ => {
                // A bucket inserted or removed in the middle: rare (a correction of an amount
                // counted alone in its bucket); rebuilt, at most 4097 buckets.
                let rest = self.iter().filter(|b| b.index != index);
                let inserted = (now > 0).then_some(Bucket { index, count: now });
                let mut all: Vec<Bucket> = rest.chain(inserted).collect();
                all.sort_by_key(|b| b.index);
                *self = Self::from_buckets(all.iter().copied())?;
            }
        }
        Ok(())
    }

    /// Bytes of the two allocations: offsets, counts.
    fn allocations(&self) -> (usize, usize) {
        let offsets = self
            .offsets
            .capacity()
            .saturating_mul(std::mem::size_of::<u32>());
        let counts = self.counts.capacity().saturating_mul(self.counts.width());
        (offsets, counts)
    }
}

/// `index - base` if it fits a `u32`.
fn offset(base: i64, index: i64) -> Option<u32> {
    u32::try_from(i128::from(index).saturating_sub(i128::from(base))).ok()
}

impl PartialEq for Buckets {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Buckets {}

impl fmt::Debug for Buckets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl serde::Serialize for Buckets {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> serde::Deserialize<'de> for Buckets {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Buckets;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence of buckets")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Buckets, A::Error> {
                // A claimed length is untrusted: preallocate at most a valid window's.
                let hint = seq.size_hint().unwrap_or(0);
                let mut all: Vec<Bucket> =
                    Vec::with_capacity(hint.min(MAX_BUCKETS_USIZE.saturating_add(1)));
                while let Some(b) = seq.next_element::<Bucket>()? {
                    all.push(b);
                }
                Buckets::from_buckets(all.iter().copied())
                    .map_err(|e| serde::de::Error::custom(e.to_string()))
            }
        }
        deserializer.deserialize_seq(Visitor)
    }
}

/// What `record` will change, decided before anything is changed.
struct Plan {
    /// Oldest buckets to drop.
    expired: usize,
    add: Add,
}

#[derive(Clone, Copy)]
enum Add {
    Nothing,
    /// New count of the newest bucket.
    ToNewest(i64),
    Push(Bucket),
}

/// Calls `out(address, bytes)` for the first and the last element of `q` (where the buckets
/// arrive and leave). Addresses only, for prefetching ([`Window::hot_addresses`]).
fn queue_ends<T>(q: &VecDeque<T>, out: &mut impl FnMut(*const u8, usize)) {
    for e in [q.front(), q.back()].into_iter().flatten() {
        out(std::ptr::from_ref::<T>(e).cast(), std::mem::size_of::<T>());
    }
}

/// Spare capacity tolerated before shrinking, in buckets.
const CAPACITY_SLACK: usize = 8;

impl Window {
    /// An empty key created by a call with `params` at `now_ms` (unix ms).
    /// Holds nothing until [`Self::record`].
    pub fn new(params: &WindowParams, now_ms: i64) -> Self {
        Self {
            window_ms: params.window_ms,
            precision_ms: params.precision_ms,
            horizon_ms: params.window_ms,
            last_ms: now_ms,
            buckets: Buckets::default(),
            extras: None,
        }
    }

    /// Pure: what a call with `params` at `now_ms` (unix ms) would decide
    /// (PEEK, and the first half of a counting call). Reports the state as is:
    /// `remaining`/`reset_after_ms` do not include `params.cost`.
    ///
    /// # Errors
    ///
    /// Invalid `params` (see [`WindowParams::parse`]);
    /// [`WindowError::Overflow`] only for a corrupt value.
    // Inlined: its result, returned through memory, stalled MRESERVE (docs/benchmarks.md).
    #[inline(always)]
    pub fn check(&self, params: &WindowParams, now_ms: i64) -> Result<WindowDecision, WindowError> {
        params.validate()?;
        let now = self.effective_now(now_ms);
        Ok(match self.rebucketed(params.precision_ms)? {
            Some(converted) => decide(converted.iter().copied(), &Ask::new(params, now, now_ms)),
            None => decide_held(&self.buckets, &Ask::new(params, now, now_ms)),
        })
    }

    /// The effect of an admitted call: converts to `params`' precision and
    /// horizon, drops buckets that left the horizon, adds `params.cost` at
    /// `now_ms` (unix ms, moved up to [`Self::last_ms`] if earlier).
    /// Deterministic and unconditional (a replica applies it without deciding);
    /// all or nothing: on error the value is unchanged. Returns the state after
    /// recording (`allowed` true, `retry_after_ms` 0).
    ///
    /// # Errors
    ///
    /// Invalid `params`; [`WindowError::Overflow`] if the held costs
    /// would sum past `i64::MAX`.
    pub fn record(
        &mut self,
        params: &WindowParams,
        now_ms: i64,
    ) -> Result<WindowDecision, WindowError> {
        self.record_inner(params, now_ms, None)
    }

    /// [`Window::record`] of a call that `checked` (this window's [`Window::check`] with the
    /// same `params` and `now_ms`) admitted: the same state and the same decision, which is
    /// worked out from `checked` instead of a second pass over the buckets when the precision
    /// is unchanged and `cost > 0` (the new cost's bucket is then the newest, and nothing the
    /// record drops was counted). The master's path; replicas use [`Window::record`].
    ///
    /// # Errors
    ///
    /// As [`Window::record`].
    pub fn record_admitted(
        &mut self,
        params: &WindowParams,
        now_ms: i64,
        checked: &WindowDecision,
    ) -> Result<WindowDecision, WindowError> {
        self.record_inner(params, now_ms, Some(checked))
    }

    /// What remains after counting `cost` under a configuration at `precision_ms` that
    /// `checked` (this window's [`Window::check`] before the count) admitted, without a pass
    /// over the buckets: the rule of [`Window::record_admitted`]. `None` when not admitted, or
    /// when the buckets are held at another precision (the record rebuckets them: read the
    /// value after it).
    pub fn remaining_after_admitted(
        &self,
        checked: &WindowDecision,
        precision_ms: i64,
        cost: i64,
    ) -> Option<i64> {
        (checked.allowed && precision_ms == self.precision_ms)
            .then(|| checked.remaining.saturating_sub(cost).max(0))
    }

    fn record_inner(
        &mut self,
        params: &WindowParams,
        now_ms: i64,
        checked: Option<&WindowDecision>,
    ) -> Result<WindowDecision, WindowError> {
        let (now, same_precision) = self.record_state(params, now_ms, None)?;
        if let Some(checked) = checked.filter(|c| c.allowed && same_precision && params.cost > 0) {
            // Counted grows by exactly the cost (allowed: no clamping happened), and the newest
            // bucket — the cost's — is the last to leave the window.
            let exit = bucket_last(
                bucket_of(i128::from(now), params.precision_ms)?,
                params.precision_ms,
            )
            .saturating_add(i128::from(params.window_ms));
            return Ok(WindowDecision {
                allowed: true,
                remaining: checked.remaining.saturating_sub(params.cost).max(0),
                retry_after_ms: 0,
                reset_after_ms: clamp_i64(exit.saturating_sub(i128::from(now_ms))),
            });
        }
        let ask = Ask {
            recorded: true,
            ..Ask::new(params, now, now_ms)
        };
        Ok(decide_held(&self.buckets, &ask))
    }

    /// The state change of a record, all or nothing, without working out a decision (what
    /// [`Window::apply`] needs): the effective now and whether the precision was unchanged.
    // Inlined: its result, returned through memory, stalled MRESERVE (docs/benchmarks.md).
    #[inline(always)]
    fn record_state(
        &mut self,
        params: &WindowParams,
        now_ms: i64,
        id: Option<&[u8]>,
    ) -> Result<(i64, bool), WindowError> {
        params.validate()?;
        if let Some(now) = self.record_in_newest(params, now_ms, id)? {
            return Ok((now, true));
        }
        self.record_planned(params, now_ms, id)
    }

    /// [`Window::record_state`] of validated `params` by its plan: every case.
    fn record_planned(
        &mut self,
        params: &WindowParams,
        now_ms: i64,
        id: Option<&[u8]>,
    ) -> Result<(i64, bool), WindowError> {
        // Taken before the record changes the precision.
        let same_precision = params.precision_ms == self.precision_ms;
        let (old_precision, old_last) = (self.precision_ms, i128::from(self.last_ms));
        let now = self.effective_now(now_ms);
        let counted_at = bucket_of(i128::from(now), params.precision_ms)?;
        let horizon_ms = self.next_horizon(params);
        let budget = max_len(horizon_ms, params.precision_ms);
        let (p, h, c) = (params.precision_ms, horizon_ms, params.cost);
        // The ids follow their buckets to a new precision (the rule of `rebucketed`).
        let remap_id = |index: i64| {
            let at = bucket_last(index, old_precision).min(old_last);
            bucket_of(at, p).unwrap_or(index)
        };
        // What the ids can hold is checked before anything changes (a window's indexes are
        // far inside it; only a forged value could be outside).
        if id.is_some() && !Remembered::holds_index(counted_at) {
            return Err(WindowError::Overflow);
        }
        if !same_precision
            && !self
                .remembered()
                .iter()
                .all(|(_, e)| Remembered::holds_index(remap_id(e.index)))
        {
            return Err(WindowError::Overflow);
        }
        match self.rebucketed(params.precision_ms)? {
            Some(converted) => {
                let plan = plan(Held::converted(&converted), p, h, now, c)?;
                let kept = converted.iter().copied().skip(plan.expired);
                let mut buckets = Buckets::from_buckets(kept)?;
                buckets.advance(0, plan.add, budget)?;
                // Nothing below can fail.
                self.buckets = buckets;
            }
            None => {
                let held = Held {
                    buckets: self.buckets.iter(),
                    len: self.buckets.len(),
                    total: self.buckets.total,
                    newest: self.buckets.newest(),
                };
                let plan = plan(held, p, h, now, c)?;
                // All or nothing; nothing after it can fail.
                self.buckets.advance(plan.expired, plan.add, budget)?;
            }
        }
        // Keep the heap proportional to what is held after a shrink or conversion.
        self.buckets.trim();
        if !same_precision && !self.remembered().is_empty() {
            // Checked above: cannot fail.
            self.ids_mut()
                .remap(remap_id)
                .map_err(|_| WindowError::Overflow)?;
        }
        self.window_ms = params.window_ms;
        self.precision_ms = params.precision_ms;
        self.horizon_ms = horizon_ms;
        self.last_ms = now;
        self.forget_stale(now);
        if let Some(id) = id {
            // Its index was checked above; a `u32::MAX`-th id is refused by `max_ids` first.
            self.ids_mut()
                .put(
                    id,
                    Entry {
                        index: counted_at,
                        counted: params.cost,
                        status: IdStatus::Pending,
                    },
                )
                .map_err(|_| WindowError::Overflow)?;
        }
        Ok((now, same_precision))
    }

    /// [`Window::record_state`]'s usual case, without its plan: `params` (validated) at the
    /// held window and precision, a positive cost counted in the newest bucket, and no bucket
    /// leaving the horizon. Reaches the very state, and result, the general path would (a
    /// property test compares them); `Ok(None)` (nothing changed) in any other case, which the
    /// general path then handles, its errors included.
    ///
    /// # Errors
    ///
    /// As the general path's: none is reachable (what could fail is checked first).
    fn record_in_newest(
        &mut self,
        params: &WindowParams,
        now_ms: i64,
        id: Option<&[u8]>,
    ) -> Result<Option<i64>, WindowError> {
        let Some(planned) = self.newest_count(params, now_ms, id) else {
            return Ok(None);
        };
        let (now, counted_at, count, first_kept) = planned;
        self.buckets.set_newest(count);
        self.buckets.trim();
        self.last_ms = now;
        // `forget_stale(now)`, with the edge of the ids worked out above when the horizon is
        // the window (a configured key's): the same value, one division fewer.
        let first_live = if self.horizon_ms == self.window_ms {
            i64::try_from(first_kept).unwrap_or(i64::MIN)
        } else {
            self.first_live_index(now)
        };
        self.forget_ids_before(first_live);
        if let Some(id) = id {
            let entry = Entry {
                index: counted_at,
                counted: params.cost,
                status: IdStatus::Pending,
            };
            // As the general path: checked above, cannot fail.
            self.ids_mut()
                .put(id, entry)
                .map_err(|_| WindowError::Overflow)?;
        }
        Ok(Some(now))
    }

    /// Whether [`Window::record_in_newest`] applies, without changing anything: the effective
    /// now, the cost's bucket index, the newest bucket's count after it, and the first bucket
    /// index inside the horizon.
    fn newest_count(
        &self,
        params: &WindowParams,
        now_ms: i64,
        id: Option<&[u8]>,
    ) -> Option<(i64, i64, i64, i128)> {
        if params.precision_ms != self.precision_ms
            || params.window_ms != self.window_ms
            || params.cost <= 0
        {
            return None;
        }
        let horizon_ms = self.next_horizon(params);
        if horizon_ms != self.horizon_ms {
            return None;
        }
        let now = self.effective_now(now_ms);
        let counted_at = now.checked_div_euclid(params.precision_ms)?;
        let newest = self.buckets.newest()?;
        let oldest = self.buckets.index_at(0)?;
        let first_kept = first_inside(now, horizon_ms, params.precision_ms);
        if newest.index != counted_at
            || i128::from(oldest) < first_kept
            || (id.is_some() && !Remembered::holds_index(counted_at))
        {
            return None;
        }
        let count = newest.count.checked_add(params.cost)?;
        i64::try_from(self.buckets.total.checked_add(i128::from(params.cost))?).ok()?;
        // What `Remembered::put` refuses (an index outside its range, checked above, or a
        // `u32::MAX`-th id) is left to the general path.
        if id.is_some() && u32::try_from(self.remembered().len()).is_err() {
            return None;
        }
        Some((now, counted_at, count, first_kept))
    }

    /// Window of the last recorded call, ms.
    pub fn window_ms(&self) -> i64 {
        self.window_ms
    }

    /// Bucket width of the held history, ms.
    pub fn precision(&self) -> i64 {
        self.precision_ms
    }

    /// The stored configuration, if any (`QUOTA.SET key WINDOW ...`).
    pub fn config(&self) -> Option<&WindowConfig> {
        self.extras.as_ref().and_then(|e| e.config.as_ref())
    }

    /// Calls `out(address, bytes)` for memory below the window's own struct that a counted
    /// call is about to read: both ends of its buckets and of its remembered ids. Addresses
    /// only, for prefetching (as [`crate::core::ledger::Budget::hot_addresses`]).
    pub fn hot_addresses(&self, out: &mut impl FnMut(*const u8, usize)) {
        queue_ends(&self.buckets.offsets, out);
        match &self.buckets.counts {
            Counts::Narrow(q) => queue_ends(q, out),
            Counts::Wide(q) => queue_ends(q, out),
        }
        self.remembered().hot_addresses(out);
    }

    /// The remembered ids of multi-key reservations.
    pub fn remembered(&self) -> &Remembered {
        self.extras.as_ref().map_or(&NO_IDS, |e| &e.ids)
    }

    /// The shell's note of where it indexed this key's remembered ids (`None`: a window
    /// without a configuration or ids, never indexed by tag).
    pub fn index_tag(&self) -> Option<&IndexTag> {
        self.extras.as_ref().map(|e| &e.index_tag)
    }

    fn extras_mut(&mut self) -> &mut Extras {
        self.extras.get_or_insert_with(Box::default)
    }

    fn ids_mut(&mut self) -> &mut Remembered {
        &mut self.extras_mut().ids
    }

    /// The heap allocations of the boxed configuration and ids, in bytes, for MEMORY USAGE:
    /// the box, then the ids' ([`Remembered::allocations`]: queue, table, long ids, each long
    /// id rounded by `size_class`).
    pub fn extras_allocations(
        &self,
        size_class: impl Fn(usize) -> usize,
    ) -> (usize, (usize, usize, usize)) {
        match &self.extras {
            Some(e) => (std::mem::size_of::<Extras>(), e.ids.allocations(size_class)),
            None => (0, (0, 0, 0)),
        }
    }

    /// The first bucket index still inside the window at `now` (unix ms): bucket `i` counts
    /// iff `bucket_last(i) + window_ms > now`, i.e. `i >= floor((now - window_ms + 1) / p)`.
    fn first_live_index(&self, now: i64) -> i64 {
        let from = i128::from(now)
            .saturating_sub(i128::from(self.window_ms))
            .saturating_add(1);
        bucket_of(from, self.precision_ms).unwrap_or(i64::MIN)
    }

    /// Physically forgets the ids whose bucket left the window at `now`; returns how many.
    fn forget_stale(&mut self, now: i64) -> usize {
        self.forget_ids_before(self.first_live_index(now))
    }

    /// Physically forgets the ids whose bucket index is below `first`; returns how many.
    fn forget_ids_before(&mut self, first: i64) -> usize {
        match self.remembered().oldest_index() {
            Some(oldest) if oldest < first => self.ids_mut().forget_before(first),
            _ => 0,
        }
    }

    /// `id`'s entry as the key sees it at `now_ms`: `None` once its bucket has left the
    /// window (whether or not it was physically forgotten yet).
    // Inlined: its result, returned through memory, stalled MRESERVE (docs/benchmarks.md).
    #[inline(always)]
    pub fn id_entry(&self, id: &[u8], now_ms: i64) -> Option<Entry> {
        let now = self.effective_now(now_ms);
        self.remembered()
            .get(id)
            .filter(|e| e.index >= self.first_live_index(now))
    }

    /// Unix ms at which the oldest remembered id's bucket leaves the window (the sweeper's
    /// due time); `None` without ids.
    pub fn ids_due_ms(&self) -> Option<i64> {
        self.remembered().oldest_index().map(|index| {
            clamp_i64(
                bucket_last(index, self.precision_ms).saturating_add(i128::from(self.window_ms)),
            )
        })
    }

    /// How many ids a [`WindowEffect::Forget`] at `now_ms` would forget (0: nothing to sweep).
    pub fn stale_ids(&self, now_ms: i64) -> usize {
        let first = self.first_live_index(self.effective_now(now_ms));
        // The sweeper asks this of every due window key: a count, not a scan of all ids.
        self.remembered().count_before(first)
    }

    /// What the window counts now under `params`' window and precision, `>= 0`.
    pub fn counted(&self, params: &WindowParams, now_ms: i64) -> Result<i64, WindowError> {
        let probe = WindowParams {
            limit: i64::MAX,
            cost: 0,
            ..*params
        };
        let d = self.check(&probe, now_ms)?;
        Ok(i64::MAX.saturating_sub(d.remaining))
    }

    /// Plans an id of `QUOTA.MRESERVE` counting `cost` under the stored configuration:
    /// [`IdPlan::Grant`], [`IdPlan::Retried`] or [`IdPlan::Denied`].
    ///
    /// # Errors
    ///
    /// `ERR` without a configuration; `CONFLICT` if the id is remembered with another amount
    /// or finished; `LIMIT` if `max_ids` ids are remembered; invalid cost.
    // Inlined: its result, returned through memory, stalled MRESERVE (docs/benchmarks.md).
    #[inline(always)]
    pub fn plan_id_reserve(
        &self,
        now_ms: i64,
        id: &[u8],
        cost: i64,
        max_ids: i64,
    ) -> Result<IdPlan, LedgerError> {
        let cfg = *self.config().ok_or(LedgerError::Invalid(NOT_CONFIGURED))?;
        match self.id_entry(id, now_ms) {
            Some(e) if e.status == IdStatus::Pending && e.counted == cost => {
                return Ok(IdPlan::Retried)
            }
            Some(e) if e.status == IdStatus::Pending => {
                return Err(window_conflict(
                    id,
                    "pending",
                    "pending with a different amount",
                ))
            }
            Some(e) => {
                return Err(window_conflict(
                    id,
                    e.status.name(),
                    "a finished id cannot be reserved again",
                ))
            }
            None => {}
        }
        let d = self
            .check(&cfg.params(cost), now_ms)
            .map_err(window_error)?;
        if !d.allowed {
            return Ok(IdPlan::Denied(d));
        }
        let mut held = self.remembered().len();
        if i64::try_from(held).unwrap_or(i64::MAX) >= max_ids {
            // Ids whose bucket left the window are gone (the record forgets them first): only
            // the live ones count. Worked out only at the cap.
            let first = self.first_live_index(self.effective_now(now_ms));
            held = held.saturating_sub(self.remembered().count_before(first));
        }
        if i64::try_from(held).unwrap_or(i64::MAX) >= max_ids {
            return Err(LedgerError::TooManyRemembered { max: max_ids });
        }
        // The record must not refuse it (what it keeps, plus the cost, within i64). The check
        // above validated these parameters.
        self.record_fits_valid(&cfg.params(cost), now_ms)
            .map_err(|_| LedgerError::Overflow)?;
        Ok(IdPlan::Grant(d))
    }

    /// Whether [`Window::record`] with `params` at `now_ms` would succeed: the checks it makes
    /// before changing anything, without changing anything.
    ///
    /// # Errors
    ///
    /// As [`Window::record`].
    pub fn record_fits(&self, params: &WindowParams, now_ms: i64) -> Result<(), WindowError> {
        params.validate()?;
        self.record_fits_valid(params, now_ms)
    }

    /// [`Window::record_fits`] of `params` already validated (by a [`Window::check`] of them).
    #[inline]
    fn record_fits_valid(&self, params: &WindowParams, now_ms: i64) -> Result<(), WindowError> {
        // The usual case without a pass over the buckets: at the held precision, everything
        // held plus the cost fits i64, so what is kept plus the cost and the newest bucket plus
        // the cost fit too; and the cost's bucket index `floor(now / precision)` of an i64 time
        // at a valid (positive) precision is an i64 (what `plan` checks).
        if params.precision_ms == self.precision_ms
            && i64::try_from(self.buckets.total.saturating_add(i128::from(params.cost))).is_ok()
        {
            return Ok(());
        }
        self.record_fits_planned(params, now_ms)
    }

    /// [`Window::record_fits_valid`] by planning the record.
    fn record_fits_planned(&self, params: &WindowParams, now_ms: i64) -> Result<(), WindowError> {
        let now = self.effective_now(now_ms);
        let horizon_ms = self.next_horizon(params);
        let (p, h, c) = (params.precision_ms, horizon_ms, params.cost);
        match self.rebucketed(params.precision_ms)? {
            Some(converted) => plan(Held::converted(&converted), p, h, now, c).map(|_| ()),
            None => {
                let held = Held {
                    buckets: self.buckets.iter(),
                    len: self.buckets.len(),
                    total: self.buckets.total,
                    newest: self.buckets.newest(),
                };
                plan(held, p, h, now, c).map(|_| ())
            }
        }
    }

    /// Plans the settle of `id` with `actual` at `now_ms`: [`IdPlan::Corrected`],
    /// [`IdPlan::Duplicate`] or [`IdPlan::Skipped`] (not remembered, or rolled back: its count
    /// was given back, and a window is a rate limit, not the bill; the budgets of the request
    /// still take their late charge).
    ///
    /// # Errors
    ///
    /// `CONFLICT` if the id was settled with another actual; `ERR` if the correction would
    /// overflow; a negative actual.
    pub fn plan_id_settle(
        &self,
        now_ms: i64,
        id: &[u8],
        actual: i64,
    ) -> Result<IdPlan, LedgerError> {
        if actual < 0 {
            return Err(LedgerError::Invalid("actual must not be negative"));
        }
        let Some(e) = self.id_entry(id, now_ms) else {
            return Ok(IdPlan::Skipped);
        };
        match e.status {
            IdStatus::Pending => {
                let delta = actual.checked_sub(e.counted).ok_or(LedgerError::Overflow)?;
                let count = self.buckets.count_of(e.index);
                let total = self.buckets.total.saturating_add(i128::from(delta));
                if i128::from(count).saturating_add(i128::from(delta)) > i128::from(i64::MAX)
                    || total > i128::from(i64::MAX)
                {
                    return Err(LedgerError::Overflow);
                }
                Ok(IdPlan::Corrected { delta })
            }
            IdStatus::Settled if e.counted == actual => Ok(IdPlan::Duplicate),
            IdStatus::Settled => Err(window_conflict(
                id,
                "settled",
                "already settled with another actual",
            )),
            IdStatus::RolledBack => Ok(IdPlan::Skipped),
        }
    }

    /// Plans the rollback of `id` at `now_ms`: [`IdPlan::RolledBack`], [`IdPlan::Duplicate`]
    /// or [`IdPlan::Skipped`].
    ///
    /// # Errors
    ///
    /// `CONFLICT` if the id was settled (a rollback never un-charges).
    pub fn plan_id_rollback(&self, now_ms: i64, id: &[u8]) -> Result<IdPlan, LedgerError> {
        let Some(e) = self.id_entry(id, now_ms) else {
            return Ok(IdPlan::Skipped);
        };
        match e.status {
            IdStatus::Pending => Ok(IdPlan::RolledBack {
                released: e.counted,
            }),
            IdStatus::RolledBack => Ok(IdPlan::Duplicate),
            IdStatus::Settled => Err(window_conflict(
                id,
                "settled",
                "a rollback never un-charges",
            )),
        }
    }

    /// Applies one effect at `at_ms` (unix ms). Deterministic and all or nothing: on error the
    /// value is unchanged. A settle or rollback of an id the key no longer remembers is an
    /// error here (the master sends one only for a remembered id).
    ///
    /// # Errors
    ///
    /// [`WindowError`] for invalid parameters, an overflow, or an effect that does not fit
    /// the state ([`WindowError::Corrupt`] naming it).
    // Inlined: its result, returned through memory, stalled MRESERVE (docs/benchmarks.md).
    #[inline(always)]
    pub fn apply(&mut self, at_ms: i64, effect: &WindowEffect) -> Result<(), WindowError> {
        match effect {
            WindowEffect::Configure(cfg) => {
                let params = cfg.params(0);
                self.record_state(&params, at_ms, None)?;
                self.extras_mut().config = Some(*cfg);
            }
            WindowEffect::Count {
                window_ms,
                precision_ms,
                cost,
                id,
            } => {
                let params = WindowParams {
                    limit: 0,
                    window_ms: *window_ms,
                    precision_ms: *precision_ms,
                    cost: *cost,
                };
                self.record_state(&params, at_ms, id.as_deref())?;
            }
            WindowEffect::Settle { id, actual } => self.finish_id(at_ms, id, Some(*actual))?,
            WindowEffect::Rollback { id } => self.finish_id(at_ms, id, None)?,
            WindowEffect::Forget => {
                self.forget_stale(self.effective_now(at_ms));
            }
        }
        Ok(())
    }

    /// Corrects a pending id's count to `actual` (`None`: 0, a rollback) and finishes it.
    fn finish_id(&mut self, at_ms: i64, id: &[u8], actual: Option<i64>) -> Result<(), WindowError> {
        let e = self
            .id_entry(id, at_ms)
            .filter(|e| e.status == IdStatus::Pending)
            .ok_or(WindowError::Corrupt("no pending id to settle or roll back"))?;
        let to = actual.unwrap_or(0);
        if to < 0 {
            return Err(WindowError::NegativeCost);
        }
        let delta = to.checked_sub(e.counted).ok_or(WindowError::Overflow)?;
        self.buckets.adjust(e.index, delta)?;
        // The same id in the same bucket: replaced in place, cannot fail.
        self.ids_mut()
            .put(
                id,
                Entry {
                    counted: to,
                    status: if actual.is_some() {
                        IdStatus::Settled
                    } else {
                        IdStatus::RolledBack
                    },
                    ..e
                },
            )
            .map_err(|_| WindowError::Overflow)?;
        self.forget_stale(self.effective_now(at_ms));
        Ok(())
    }

    /// Attaches a decoded configuration and ids (encoding 2) to a decoded window; the caller
    /// validates the result.
    pub fn with_extras(mut self, config: Option<WindowConfig>, ids: Remembered) -> Self {
        self.extras = (config.is_some() || !ids.is_empty()).then(|| {
            Box::new(Extras {
                config,
                ids,
                index_tag: IndexTag::default(),
            })
        });
        self
    }

    /// Unix ms at which the newest bucket leaves the horizon: from then on the
    /// value holds nothing a window up to the horizon could count, so the key
    /// may expire then.
    /// `None` if it holds nothing now (the key need not be kept). Saturates at
    /// `i64::MAX`.
    pub fn empty_at_ms(&self) -> Option<i64> {
        let horizon = i128::from(self.horizon_ms);
        // Buckets are in increasing index order (kept so, and checked on load): the newest
        // leaves last.
        self.buckets
            .newest_index()
            .map(|index| clamp_i64(bucket_last(index, self.precision_ms).saturating_add(horizon)))
    }

    /// Heap bytes owned (bucket storage, by capacity), for the tests' bounds (MEMORY USAGE
    /// counts [`Window::allocations`] instead):
    /// 8 per bucket slot (12 with wide counts). At most about
    /// `(1.5 * (ceil(horizon / precision) + 1) + 8) * 12` after a record; under steady traffic
    /// exactly `8 * (ceil(horizon / precision) + 1)`.
    #[cfg(test)]
    pub fn heap_bytes(&self) -> usize {
        self.buckets.heap_bytes()
    }

    /// The two heap allocations of the bucket storage, in bytes (offsets, counts), for
    /// MEMORY USAGE in allocator size classes.
    pub fn allocations(&self) -> (usize, usize) {
        self.buckets.allocations()
    }

    /// Latest recorded time, unix ms.
    #[cfg(test)]
    pub fn last_ms(&self) -> i64 {
        self.last_ms
    }

    /// Bucket width of the held history, ms.
    #[cfg(test)]
    pub fn precision_ms(&self) -> i64 {
        self.precision_ms
    }

    /// How far back history is kept, ms (see module doc).
    #[cfg(test)]
    pub fn horizon_ms(&self) -> i64 {
        self.horizon_ms
    }

    /// Number of non-empty buckets held; at most `ceil(horizon / precision) + 1`.
    #[cfg(test)]
    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// Checks a loaded (possibly corrupt) value: valid window and precision,
    /// `window_ms <= horizon_ms <= 4096 * precision_ms`, at most
    /// `ceil(horizon / precision) + 1` buckets, each with count `> 0`, strictly
    /// increasing, none after `last_ms` nor wholly before `last_ms - horizon_ms`,
    /// total cost fitting `i64`. Never panics.
    ///
    /// # Errors
    ///
    /// [`WindowError::Corrupt`] naming the broken invariant.
    pub fn validate(&self) -> Result<(), WindowError> {
        if self.window_ms <= 0 {
            return Err(WindowError::Corrupt("window_ms"));
        }
        check_precision(self.window_ms, self.precision_ms)
            .map_err(|_| WindowError::Corrupt("precision_ms"))?;
        let cap = i128::from(self.precision_ms).saturating_mul(i128::from(MAX_BUCKETS));
        if self.horizon_ms < self.window_ms || i128::from(self.horizon_ms) > cap {
            return Err(WindowError::Corrupt("horizon_ms"));
        }
        let max_len = max_len(self.horizon_ms, self.precision_ms)
            .ok_or(WindowError::Corrupt("horizon_ms"))?;
        if self.buckets.len() > max_len {
            return Err(WindowError::Corrupt("too many buckets"));
        }
        let newest = bucket_of(i128::from(self.last_ms), self.precision_ms)
            .map_err(|_| WindowError::Corrupt("last_ms"))?;
        let last = i128::from(self.last_ms);
        let horizon = i128::from(self.horizon_ms);
        let mut previous: Option<i64> = None;
        let mut total: i64 = 0;
        for b in self.buckets.iter() {
            if b.count <= 0 {
                return Err(WindowError::Corrupt("bucket count"));
            }
            if previous.is_some_and(|p| b.index <= p) {
                return Err(WindowError::Corrupt("bucket order"));
            }
            if b.index > newest {
                return Err(WindowError::Corrupt("bucket after last_ms"));
            }
            if bucket_last(b.index, self.precision_ms).saturating_add(horizon) <= last {
                return Err(WindowError::Corrupt("bucket outside horizon"));
            }
            total = total
                .checked_add(b.count)
                .ok_or(WindowError::Corrupt("total cost"))?;
            previous = Some(b.index);
        }
        if i128::from(total) != self.buckets.total {
            return Err(WindowError::Corrupt("cached total"));
        }
        self.validate_extras()
    }

    /// The configuration and the remembered ids: a valid configuration; each id in a bucket
    /// still inside the window at `last_ms` and not after it, counting `>= 0` (its amount while
    /// pending, 0 once rolled back), and the ids of a bucket counting no more than it holds.
    fn validate_extras(&self) -> Result<(), WindowError> {
        if let Some(c) = self.config() {
            WindowConfig::parse(c.limit, c.window_ms, Some(c.precision_ms))
                .map_err(|_| WindowError::Corrupt("configuration"))?;
        }
        if self.remembered().is_empty() {
            return Ok(());
        }
        let (first, newest) = (
            self.first_live_index(self.last_ms),
            bucket_of(i128::from(self.last_ms), self.precision_ms)
                .map_err(|_| WindowError::Corrupt("last_ms"))?,
        );
        let mut checked: Option<i64> = None;
        for (id, e) in self.remembered().iter() {
            if id.is_empty() || e.index < first || e.index > newest {
                return Err(WindowError::Corrupt("remembered id outside the window"));
            }
            if checked.is_some_and(|c| c > e.index) {
                return Err(WindowError::Corrupt("remembered ids out of order"));
            }
            let ok = match e.status {
                IdStatus::Pending | IdStatus::Settled => e.counted >= 0,
                IdStatus::RolledBack => e.counted == 0,
            };
            if !ok {
                return Err(WindowError::Corrupt("remembered id amount"));
            }
            if checked != Some(e.index)
                && self.remembered().counted_in(e.index)
                    > i128::from(self.buckets.count_of(e.index))
            {
                return Err(WindowError::Corrupt(
                    "remembered ids count past their bucket",
                ));
            }
            checked = Some(e.index);
        }
        Ok(())
    }

    fn effective_now(&self, now_ms: i64) -> i64 {
        now_ms.max(self.last_ms)
    }

    /// Horizon after a record with `params`: the largest window seen, capped
    /// by the bucket budget (never below `params.window_ms`, whose bucket
    /// span is within the budget).
    fn next_horizon(&self, params: &WindowParams) -> i64 {
        // Saturating in i64 gives what the exact product clamped to i64 would.
        let cap = params.precision_ms.saturating_mul(MAX_BUCKETS);
        self.horizon_ms.max(params.window_ms).min(cap)
    }

    /// The buckets re-indexed for `precision_ms`, or `None` if unchanged.
    /// Each bucket goes where its last possible event (its last ms, but not
    /// after `last_ms`) falls: later, never earlier, and never in the future.
    /// A plain `Vec`: before expiry its indexes may span more than
    /// [`Buckets`] holds (finer precision after a long horizon).
    #[inline]
    fn rebucketed(&self, precision_ms: i64) -> Result<Option<Vec<Bucket>>, WindowError> {
        // Inlined: every call asks, nearly every call is at the held precision.
        if precision_ms == self.precision_ms {
            return Ok(None);
        }
        self.rebucketed_to(precision_ms).map(Some)
    }

    /// [`Window::rebucketed`] at a precision other than the held one.
    fn rebucketed_to(&self, precision_ms: i64) -> Result<Vec<Bucket>, WindowError> {
        let last = i128::from(self.last_ms);
        let mut out: Vec<Bucket> = Vec::with_capacity(self.buckets.len());
        for b in self.buckets.iter() {
            let at = bucket_last(b.index, self.precision_ms).min(last);
            let index = bucket_of(at, precision_ms)?;
            match out.last_mut() {
                Some(newest) if newest.index == index => {
                    newest.count = newest
                        .count
                        .checked_add(b.count)
                        .ok_or(WindowError::Overflow)?;
                }
                _ => out.push(Bucket {
                    index,
                    count: b.count,
                }),
            }
        }
        Ok(out)
    }
}

/// What a decision is asked about.
struct Ask<'a> {
    /// Indexes the buckets (`params.precision_ms`).
    params: &'a WindowParams,
    /// The call's time, normalised (moved up to the key's latest).
    now: i64,
    /// The caller's time, which durations are reported from.
    caller_now: i64,
    /// The call's cost is already in the buckets.
    recorded: bool,
}

impl<'a> Ask<'a> {
    fn new(params: &'a WindowParams, now: i64, caller_now: i64) -> Self {
        Ask {
            params,
            now,
            caller_now,
            recorded: false,
        }
    }
}

/// Decides from `buckets` in one pass over all of them (for buckets just converted to a new
/// precision; held buckets go through [`decide_held`]).
fn decide<I>(buckets: I, ask: &Ask<'_>) -> WindowDecision
where
    I: Iterator<Item = Bucket> + Clone,
{
    let params = ask.params;
    let now128 = i128::from(ask.now);
    let mut counted: i128 = 0;
    let mut last_exit: Option<i128> = None;
    for b in buckets.clone() {
        let exit = exit_of(b.index, params);
        if exit > now128 {
            counted = counted.saturating_add(i128::from(b.count));
            last_exit = Some(last_exit.map_or(exit, |e| e.max(exit)));
        }
    }
    conclude(counted, last_exit, || buckets, ask)
}

/// [`decide`] over held buckets, which are in increasing index order (kept so, and checked on
/// load), so those still in the window are the newest ones: a binary search finds the edge and
/// the count is summed on its shorter side ([`Buckets::split_from`]). A call into a full
/// 60 s / 1 s window reads a few buckets instead of 61.
// Inlined: its result, returned through memory, stalled MRESERVE (docs/benchmarks.md).
#[inline(always)]
fn decide_held(buckets: &Buckets, ask: &Ask<'_>) -> WindowDecision {
    let params = ask.params;
    let (first, counted) =
        buckets.split_from(first_inside(ask.now, params.window_ms, params.precision_ms));
    // The newest bucket leaves the window last.
    let last_exit = (first < buckets.len())
        .then(|| buckets.newest_index().map(|index| exit_of(index, params)))
        .flatten();
    conclude(counted, last_exit, || buckets.iter().skip(first), ask)
}

/// First instant at which bucket `index` no longer overlaps `params`' window.
fn exit_of(index: i64, params: &WindowParams) -> i128 {
    bucket_last(index, params.precision_ms).saturating_add(i128::from(params.window_ms))
}

/// The decision from what the window counts at `now`: `counted`, and `last_exit` (when the
/// newest counted bucket leaves; `None` if nothing is counted). `buckets` (oldest first, those
/// already out of the window may be left out) are read again only to find when a denied call
/// would fit (made only then).
fn conclude<I>(
    counted: i128,
    last_exit: Option<i128>,
    buckets: impl FnOnce() -> I,
    ask: &Ask<'_>,
) -> WindowDecision
where
    I: Iterator<Item = Bucket>,
{
    let (params, recorded) = (ask.params, ask.recorded);
    // i128 throughout: sums of i64 values cannot reach its bounds (`counted` sums at most
    // 4097 counts, below 2^76; an exit time is below 2^127 minus 2^64), so these differences
    // are exact as wrapping ones, which cost a third of the saturating ones.
    let now = i128::from(ask.now);
    let caller_now = i128::from(ask.caller_now);
    let limit = i128::from(params.limit);
    let cost = i128::from(params.cost);
    let remaining = clamp_i64(limit.wrapping_sub(counted).max(0));
    let reset_after_ms = last_exit.map_or(0, |e| clamp_i64(e.wrapping_sub(caller_now)));
    let excess = counted.wrapping_add(cost).wrapping_sub(limit);
    let (allowed, retry_after_ms) = if recorded || excess <= 0 {
        (true, 0)
    } else if cost > limit {
        (false, -1)
    } else {
        // Oldest buckets leave first: wait for the one that frees enough.
        // cost <= limit means freeing everything suffices, so one is found.
        let mut freed: i128 = 0;
        let mut at = last_exit;
        for b in buckets() {
            let exit = exit_of(b.index, params);
            if exit > now {
                freed = freed.saturating_add(i128::from(b.count));
                if freed >= excess {
                    at = Some(exit);
                    break;
                }
            }
        }
        (
            false,
            at.map_or(0, |e| clamp_i64(e.saturating_sub(caller_now))),
        )
    };
    WindowDecision {
        allowed,
        remaining,
        retry_after_ms,
        reset_after_ms,
    }
}

/// What a record starts from: the buckets (oldest first), how many, the sum of their counts
/// and the newest.
struct Held<I> {
    buckets: I,
    len: usize,
    total: i128,
    newest: Option<Bucket>,
}

impl<'a> Held<std::iter::Copied<std::slice::Iter<'a, Bucket>>> {
    /// Buckets just converted to a new precision.
    fn converted(buckets: &'a [Bucket]) -> Self {
        Held {
            buckets: buckets.iter().copied(),
            len: buckets.len(),
            total: buckets
                .iter()
                .fold(0i128, |t, b| t.saturating_add(i128::from(b.count))),
            newest: buckets.last().copied(),
        }
    }
}

/// Plans a record at `now` (normalised): drop what left the horizon, add `cost`. Reads only the
/// buckets that left (the oldest) and the newest.
#[inline(always)]
fn plan<I>(
    held: Held<I>,
    precision_ms: i64,
    horizon_ms: i64,
    now: i64,
    cost: i64,
) -> Result<Plan, WindowError>
where
    I: Iterator<Item = Bucket>,
{
    let first_kept = first_inside(now, horizon_ms, precision_ms);
    let now = i128::from(now);
    let mut expired: usize = 0;
    let mut expired_total: i128 = 0;
    for b in held.buckets {
        if i128::from(b.index) >= first_kept {
            break;
        }
        expired = expired.saturating_add(1);
        expired_total = expired_total.saturating_add(i128::from(b.count));
    }
    // Refuse before changing anything if what is held would not fit i64: every
    // later sum of held counts then fits too.
    let kept_total = held
        .total
        .saturating_sub(expired_total)
        .saturating_add(i128::from(cost));
    if i64::try_from(kept_total).is_err() {
        return Err(WindowError::Overflow);
    }
    let newest = held.newest.filter(|_| expired < held.len);
    let current = bucket_of(now, precision_ms)?;
    let add = if cost == 0 {
        Add::Nothing
    } else {
        match newest {
            Some(newest) if newest.index == current => Add::ToNewest(
                newest
                    .count
                    .checked_add(cost)
                    .ok_or(WindowError::Overflow)?,
            ),
            _ => Add::Push(Bucket {
                index: current,
                count: cost,
            }),
        }
    };
    Ok(Plan { expired, add })
}

fn default_precision(window_ms: i64) -> i64 {
    window_ms
        .checked_div(DEFAULT_BUCKETS)
        .map_or(1, |p| p.max(1))
}

fn check_precision(window_ms: i64, precision_ms: i64) -> Result<(), WindowError> {
    if precision_ms <= 0 {
        return Err(WindowError::PrecisionNotPositive);
    }
    if precision_ms > window_ms {
        return Err(WindowError::PrecisionAboveWindow);
    }
    // `ceil(window / precision) <= MAX_BUCKETS` without a division (every call checks it):
    // for positive values it is `window <= precision * MAX_BUCKETS`, and a product past i64
    // is above any window.
    if window_ms <= precision_ms.saturating_mul(MAX_BUCKETS) {
        Ok(())
    } else {
        Err(WindowError::TooManyBuckets)
    }
}

/// `ceil(a / b)` for `a >= 0`, `b > 0`; `None` otherwise.
fn ceil_div(a: i64, b: i64) -> Option<i64> {
    if a < 0 || b <= 0 {
        return None;
    }
    let quotient = a.checked_div(b)?;
    if a.checked_rem(b)? == 0 {
        Some(quotient)
    } else {
        quotient.checked_add(1)
    }
}

/// Most buckets a horizon can hold: `ceil(horizon / precision) + 1`.
fn max_len(horizon_ms: i64, precision_ms: i64) -> Option<usize> {
    let span = ceil_div(horizon_ms, precision_ms)?.checked_add(1)?;
    usize::try_from(span).ok()
}

/// The first bucket index (at `precision_ms > 0`) still inside a window of `window_ms` at
/// `now`: bucket `i` is inside iff `bucket_last(i) + window_ms > now`, i.e. iff
/// `i >= floor((now - window_ms + 1) / precision_ms)`. One division instead of a 128-bit
/// product per bucket compared.
fn first_inside(now: i64, window_ms: i64, precision_ms: i64) -> i128 {
    let from = i128::from(now)
        .saturating_sub(i128::from(window_ms))
        .saturating_add(1);
    if let Some(index) = i64::try_from(from)
        .ok()
        .and_then(|from| from.checked_div_euclid(precision_ms))
    {
        return i128::from(index);
    }
    from.checked_div_euclid(i128::from(precision_ms))
        .unwrap_or(i128::MIN)
}

/// Last ms of bucket `index`. Cannot saturate: `|index * precision| < 2^126`.
fn bucket_last(index: i64, precision_ms: i64) -> i128 {
    // In i64 when it fits (a bucket of a real clock always does): the same value, without
    // i128 multiplication's overflow checks.
    if let Some(last) = index
        .checked_mul(precision_ms)
        .and_then(|start| start.checked_add(precision_ms.checked_sub(1)?))
    {
        return i128::from(last);
    }
    let precision = i128::from(precision_ms);
    i128::from(index)
        .saturating_mul(precision)
        .saturating_add(precision)
        .saturating_sub(1)
}

/// Index of the bucket holding ms `t`: `floor(t / precision_ms)`.
fn bucket_of(t: i128, precision_ms: i64) -> Result<i64, WindowError> {
    // Times are i64 in practice, and a 64-bit division costs a fraction of a 128-bit one
    // (the same floor: `precision_ms > 0`, so the quotient fits).
    if let Ok(t) = i64::try_from(t) {
        return t
            .checked_div_euclid(precision_ms)
            .ok_or(WindowError::Overflow);
    }
    let index = t
        .checked_div_euclid(i128::from(precision_ms))
        .ok_or(WindowError::Overflow)?;
    i64::try_from(index).map_err(|_| WindowError::Overflow)
}

/// The error of a multi-key command on a window key without a stored configuration.
pub const NOT_CONFIGURED: &str =
    "a window key needs a stored configuration (QUOTA.SET key WINDOW limit window_ms)";

fn window_conflict(id: &[u8], state: &'static str, why: &'static str) -> LedgerError {
    LedgerError::Conflict {
        id: id.to_vec(),
        state,
        why,
    }
}

/// A window error met while planning a multi-key command (a corrupt value only).
fn window_error(_: WindowError) -> LedgerError {
    LedgerError::Overflow
}

/// Reply values beyond `i64` (absurd clocks only) saturate.
fn clamp_i64(value: i128) -> i64 {
    i64::try_from(value).unwrap_or(if value < 0 { i64::MIN } else { i64::MAX })
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A configured key's boxed extras stay in the 128-byte size class (`MEMORY USAGE` of a
    /// 60 s / 1 s configured key: 832 bytes, docs/commands.md).
    #[test]
    fn extras_fit_128_bytes() {
        assert!(
            std::mem::size_of::<Extras>() <= 128,
            "{}",
            std::mem::size_of::<Extras>()
        );
    }

    fn params(limit: i64, window_ms: i64, precision_ms: i64, cost: i64) -> WindowParams {
        WindowParams::parse(limit, window_ms, Some(cost), Some(precision_ms)).unwrap()
    }

    /// Check, then record if allowed: what the shell does for a counting call.
    /// `record_admitted` (the master's path) after `checked`, asserting it leaves the same
    /// window and gives the same decision as a plain `record`.
    fn record_both_ways(
        w: &mut Window,
        p: &WindowParams,
        now: i64,
        checked: &WindowDecision,
    ) -> WindowDecision {
        let mut twin = w.clone();
        let full = twin.record(p, now).unwrap();
        let after = w.record_admitted(p, now, checked).unwrap();
        assert_eq!(after, full);
        assert_eq!(*w, twin);
        after
    }

    fn call(w: &mut Window, p: &WindowParams, now: i64) -> WindowDecision {
        let d = w.check(p, now).unwrap();
        if d.allowed {
            let after = record_both_ways(w, p, now, &d);
            w.validate().unwrap();
            after
        } else {
            d
        }
    }

    fn decision(allowed: bool, remaining: i64, retry: i64, reset: i64) -> WindowDecision {
        WindowDecision {
            allowed,
            remaining,
            retry_after_ms: retry,
            reset_after_ms: reset,
        }
    }

    #[test]
    fn parse_defaults_and_errors() {
        let p = WindowParams::parse(10, 60_000, None, None).unwrap();
        assert_eq!((p.cost, p.precision_ms), (1, 1000));
        assert_eq!(
            WindowParams::parse(10, 59, None, None)
                .unwrap()
                .precision_ms,
            1
        );
        assert_eq!(
            WindowParams::parse(10, 1, None, None).unwrap().precision_ms,
            1
        );
        let err = |l, w, c, p| WindowParams::parse(l, w, c, p).unwrap_err().to_string();
        assert_eq!(err(1, 0, None, None), "ERR window_ms must be positive");
        assert_eq!(err(1, -5, None, None), "ERR window_ms must be positive");
        assert_eq!(err(-1, 5, None, None), "ERR limit must not be negative");
        assert_eq!(err(1, 5, Some(-1), None), "ERR COST must not be negative");
        assert_eq!(err(1, 5, None, Some(0)), "ERR PRECISION must be positive");
        assert_eq!(
            err(1, 5, None, Some(6)),
            "ERR PRECISION must not exceed window_ms"
        );
        assert_eq!(
            err(1, 4097, None, Some(1)),
            "ERR too many buckets: window_ms/PRECISION must be at most 4096 (raise PRECISION)"
        );
        assert!(WindowParams::parse(1, 4096, None, Some(1)).is_ok());
        assert!(WindowParams::parse(1, 8193, None, Some(2)).is_err());
        assert!(WindowParams::parse(1, 8192, None, Some(2)).is_ok());
        assert!(WindowParams::parse(0, i64::MAX, Some(0), None).is_ok());
        assert!(WindowError::Overflow.to_string().starts_with("ERR "));
        assert!(WindowError::Corrupt("x").to_string().starts_with("ERR "));
    }

    #[test]
    fn exactly_at_limit_then_bucket_leaves_on_time() {
        let p = params(3, 1000, 1, 1);
        let mut w = Window::new(&p, 0);
        assert_eq!(call(&mut w, &p, 0), decision(true, 2, 0, 1000));
        assert_eq!(call(&mut w, &p, 0), decision(true, 1, 0, 1000));
        assert_eq!(call(&mut w, &p, 0), decision(true, 0, 0, 1000));
        assert_eq!(call(&mut w, &p, 0), decision(false, 0, 1000, 1000));
        assert_eq!(call(&mut w, &p, 999), decision(false, 0, 1, 1));
        // At 1000 the window is (0, 1000]: the events at 0 are out.
        assert_eq!(w.check(&p, 1000).unwrap(), decision(true, 3, 0, 0));
        assert_eq!(call(&mut w, &p, 1000), decision(true, 2, 0, 1000));
    }

    #[test]
    fn retry_waits_only_for_the_buckets_needed() {
        let p = params(3, 100, 1, 1);
        let mut w = Window::new(&p, 0);
        for t in [10, 20, 30] {
            assert!(call(&mut w, &p, t).allowed);
        }
        assert_eq!(w.check(&p, 50).unwrap(), decision(false, 0, 60, 80));
        let two = params(3, 100, 1, 2);
        // Needs the events at 10 and 20 gone: 20 leaves at 120.
        assert_eq!(w.check(&two, 50).unwrap(), decision(false, 0, 70, 80));
        assert!(!w.check(&two, 119).unwrap().allowed);
        assert!(w.check(&two, 120).unwrap().allowed);
    }

    #[test]
    fn coarse_bucket_counts_until_its_last_ms_leaves() {
        let p = params(1, 1000, 100, 1);
        let mut w = Window::new(&p, 150);
        // Bucket 1 covers 100..=199, so it counts until 199 + 1000.
        assert_eq!(call(&mut w, &p, 150), decision(true, 0, 0, 1049));
        assert_eq!(w.check(&p, 1198).unwrap(), decision(false, 0, 1, 1));
        assert_eq!(w.check(&p, 1199).unwrap(), decision(true, 1, 0, 0));
        assert_eq!(w.empty_at_ms(), Some(1199));
    }

    #[test]
    fn cost_zero() {
        let p = params(2, 100, 1, 1);
        let zero = params(2, 100, 1, 0);
        let mut w = Window::new(&p, 0);
        assert_eq!(call(&mut w, &zero, 0), decision(true, 2, 0, 0));
        assert_eq!(w.bucket_count(), 0);
        assert_eq!(w.empty_at_ms(), None);
        call(&mut w, &p, 0);
        call(&mut w, &p, 10);
        // Full (counted == limit): cost 0 still fits.
        assert_eq!(call(&mut w, &zero, 20), decision(true, 0, 0, 90));
        assert_eq!(w.bucket_count(), 2);
        // Over a lowered limit: even cost 0 waits until counted <= limit.
        let lowered = params(1, 100, 1, 0);
        assert_eq!(w.check(&lowered, 20).unwrap(), decision(false, 0, 80, 90));
        assert!(w.check(&lowered, 100).unwrap().allowed);
        let nothing = params(0, 100, 1, 0);
        assert!(Window::new(&nothing, 0).check(&nothing, 0).unwrap().allowed);
    }

    #[test]
    fn cost_above_limit_never_fits() {
        let p = params(3, 100, 1, 4);
        let w = Window::new(&p, 0);
        assert_eq!(w.check(&p, 0).unwrap(), decision(false, 3, -1, 0));
        let zero_limit = params(0, 100, 1, 1);
        assert_eq!(w.check(&zero_limit, 0).unwrap(), decision(false, 0, -1, 0));
    }

    #[test]
    fn time_jump_beyond_window_drops_everything() {
        let p = params(5, 1000, 10, 1);
        let mut w = Window::new(&p, 0);
        for t in 0..5 {
            call(&mut w, &p, t * 100);
        }
        assert!(!w.check(&p, 450).unwrap().allowed);
        let later = 10_000_000;
        assert_eq!(w.check(&p, later).unwrap(), decision(true, 5, 0, 0));
        call(&mut w, &p, later);
        assert_eq!(w.bucket_count(), 1);
        assert_eq!(w.last_ms(), later);
    }

    #[test]
    fn equal_timestamps_share_a_bucket() {
        let p = params(100, 1000, 1, 1);
        let mut w = Window::new(&p, 5);
        for i in 0..100 {
            assert_eq!(call(&mut w, &p, 5).remaining, 99 - i);
        }
        assert_eq!(w.bucket_count(), 1);
        assert!(!w.check(&p, 5).unwrap().allowed);
    }

    #[test]
    fn clock_going_backwards_is_clamped() {
        let p = params(1, 100, 1, 1);
        let mut w = Window::new(&p, 1000);
        call(&mut w, &p, 1000);
        // Seen as 1000; durations count from the caller's 500.
        assert_eq!(w.check(&p, 500).unwrap(), decision(false, 0, 600, 600));
        assert!(w.check(&p, 1099).unwrap().allowed.eq(&false));
        assert!(w.check(&p, 1100).unwrap().allowed);
        // A record from the past counts at the key's time.
        let two = params(2, 100, 1, 1);
        call(&mut w, &two, 10);
        assert_eq!(w.last_ms(), 1000);
        assert_eq!(w.bucket_count(), 1);
        assert_eq!(w.check(&two, 1050).unwrap(), decision(false, 0, 50, 50));
    }

    #[test]
    fn limit_changes_apply_at_once() {
        let p = params(2, 100, 1, 1);
        let mut w = Window::new(&p, 0);
        call(&mut w, &p, 0);
        call(&mut w, &p, 1);
        assert!(!w.check(&p, 2).unwrap().allowed);
        let up = params(3, 100, 1, 1);
        assert_eq!(call(&mut w, &up, 2), decision(true, 0, 0, 100));
        let down = params(1, 100, 1, 1);
        // 3 counted: needs 3 to leave; the third leaves at 102.
        assert_eq!(w.check(&down, 3).unwrap(), decision(false, 0, 99, 99));
    }

    #[test]
    fn window_shrink_then_regrow_within_horizon_is_exact() {
        let big = params(2, 1000, 1, 1);
        let mut w = Window::new(&big, 0);
        call(&mut w, &big, 0);
        call(&mut w, &big, 1);
        let small = params(2, 100, 1, 1);
        // At 500 the 100 ms window is empty.
        assert_eq!(call(&mut w, &small, 500), decision(true, 1, 0, 100));
        assert_eq!(w.horizon_ms(), 1000);
        assert_eq!(w.bucket_count(), 3);
        // Back to 1000 ms: the events at 0 and 1 still count.
        assert_eq!(w.check(&big, 501).unwrap(), decision(false, 0, 500, 999));
    }

    #[test]
    fn window_growth_past_horizon_phases_in() {
        let small = params(1, 100, 1, 1);
        let mut w = Window::new(&small, 0);
        call(&mut w, &small, 0);
        // Recording at 150 with a 100 ms horizon drops the event at 0.
        call(&mut w, &small, 150);
        assert_eq!(w.bucket_count(), 1);
        let big = params(2, 1000, 1, 1);
        // The exact 1000 ms log holds 2 events, but only one is remembered:
        // the documented phase-in (history before 150 - 100 is forgotten).
        assert_eq!(w.check(&big, 160).unwrap(), decision(true, 1, 0, 990));
    }

    #[test]
    fn precision_changes_move_events_later_never_earlier() {
        let fine = params(2, 1000, 1, 1);
        let mut w = Window::new(&fine, 0);
        call(&mut w, &fine, 0);
        call(&mut w, &fine, 150);
        let coarse = params(2, 1000, 100, 1);
        // Events at 0 and 150 now count as 99 and 199 (their bucket ends).
        assert_eq!(
            w.check(&coarse, 160).unwrap(),
            decision(false, 0, 939, 1039)
        );
        assert_eq!(w.check(&fine, 160).unwrap(), decision(false, 0, 840, 990));
        // Finer again after recording coarse: the coarse bucket 1 (100..=199)
        // moves to min(199, last 170) = 170, not into the future.
        let coarse1 = params(3, 1000, 100, 1);
        call(&mut w, &coarse1, 170);
        w.validate().unwrap();
        let fine3 = params(3, 1000, 1, 1);
        assert_eq!(w.check(&fine3, 180).unwrap(), decision(false, 0, 919, 990));
        call(&mut w, &params(4, 1000, 1, 1), 180);
        w.validate().unwrap();
        assert_eq!(w.precision_ms(), 1);
    }

    #[test]
    fn overflow_is_an_error_and_changes_nothing() {
        let p = params(i64::MAX, 1000, 1, i64::MAX);
        let mut w = Window::new(&p, 0);
        assert!(call(&mut w, &p, 0).allowed);
        let one = params(i64::MAX, 1000, 1, 1);
        assert!(!w.check(&one, 1).unwrap().allowed);
        let before = w.clone();
        assert_eq!(w.record(&one, 1), Err(WindowError::Overflow));
        assert_eq!(w, before);
        assert_eq!(w.record(&one, 0), Err(WindowError::Overflow));
        assert_eq!(w, before);
    }

    #[test]
    fn invalid_hand_built_params_are_refused() {
        let good = params(1, 100, 1, 1);
        let mut w = Window::new(&good, 0);
        let bad = WindowParams {
            precision_ms: 0,
            ..good
        };
        assert_eq!(w.check(&bad, 0), Err(WindowError::PrecisionNotPositive));
        assert_eq!(w.record(&bad, 0), Err(WindowError::PrecisionNotPositive));
    }

    #[test]
    fn validate_rejects_corrupt_values() {
        let good = Window {
            window_ms: 100,
            precision_ms: 10,
            horizon_ms: 100,
            last_ms: 1000,
            buckets: held(&[(95, 1), (100, 2)]),
            extras: None,
        };
        good.validate().unwrap();
        let with = |f: &dyn Fn(&mut Window)| {
            let mut w = good.clone();
            f(&mut w);
            w.validate().unwrap_err()
        };
        let edit = |f: &dyn Fn(&mut Vec<Bucket>)| {
            with(&|w| {
                let mut v: Vec<Bucket> = w.buckets.iter().collect();
                f(&mut v);
                w.buckets = Buckets::from_buckets(v.iter().copied()).unwrap();
            })
        };
        with(&|w| w.window_ms = 0);
        with(&|w| w.precision_ms = 0);
        with(&|w| w.precision_ms = 101);
        with(&|w| w.horizon_ms = 99);
        with(&|w| w.horizon_ms = 10 * 4096 + 1);
        edit(&|b| b[0].count = 0);
        edit(&|b| b[0].count = -1);
        edit(&|b| b[0].index = 100);
        edit(&|b| b[1].index = 101);
        edit(&|b| b[0].index = 89);
        edit(&|b| {
            b[0].count = i64::MAX;
        });
        edit(&|b| {
            *b = (0..20)
                .map(|i| Bucket {
                    index: 90 + i,
                    count: 1,
                })
                .collect();
        });
    }

    /// Buckets from `(index, count)` pairs.
    fn held(pairs: &[(i64, i64)]) -> Buckets {
        Buckets::from_buckets(pairs.iter().map(|&(index, count)| Bucket { index, count })).unwrap()
    }

    fn pairs(b: &Buckets) -> Vec<(i64, i64)> {
        b.iter().map(|b| (b.index, b.count)).collect()
    }

    #[test]
    fn buckets_hold_any_sequence_spanning_at_most_u32() {
        let far = i64::from(u32::MAX);
        for seq in [
            vec![],
            vec![(i64::MIN, 1)],
            vec![(i64::MAX, -1), (i64::MAX - far, 0)],
            vec![(5, 1), (3, 2), (5, 3)],
            vec![(i64::MIN, 1), (i64::MIN + far, 2)],
        ] {
            let b = held(&seq);
            assert_eq!(pairs(&b), seq);
            assert_eq!(b.len(), seq.len());
            // 8 bytes a bucket while every count fits a u32 (and here is not negative).
            let narrow = seq.iter().all(|&(_, c)| u32::try_from(c).is_ok());
            assert_eq!(b.heap_bytes(), if narrow { 8 } else { 12 } * seq.len());
        }
        for seq in [
            vec![(0, 1), (far + 1, 1)],
            vec![(i64::MIN, 1), (i64::MAX, 1)],
            vec![(far, 1), (-1, 1)],
        ] {
            let from = seq.iter().map(|&(index, count)| Bucket { index, count });
            assert_eq!(
                Buckets::from_buckets(from),
                Err(WindowError::Corrupt("bucket index span"))
            );
        }
    }

    #[test]
    fn buckets_rebase_when_a_push_does_not_fit() {
        let far = i64::from(u32::MAX);
        let push = |index| Add::Push(Bucket { index, count: 7 });
        let mut b = held(&[(10, 1), (20, 2), (30, 3)]);
        assert_eq!(b.base, 10);
        // Fits the current base: no rebase.
        b.advance(1, push(far + 10), None).unwrap();
        assert_eq!(b.base, 10);
        assert_eq!(pairs(&b), [(20, 2), (30, 3), (far + 10, 7)]);
        // Past u32 from the base: rebased on the oldest kept bucket.
        b.advance(1, push(far + 30), None).unwrap();
        assert_eq!(b.base, 30);
        assert_eq!(pairs(&b), [(30, 3), (far + 10, 7), (far + 30, 7)]);
        // Too wide whatever the base: refused, unchanged.
        let before = b.clone();
        assert_eq!(
            b.advance(0, push(far + 31), None),
            Err(WindowError::Corrupt("bucket index span"))
        );
        assert_eq!(b, before);
        assert_eq!(b.base, 30);
        // Out of order but above the base: as is.
        b.advance(2, push(100), None).unwrap();
        assert_eq!(pairs(&b), [(far + 30, 7), (100, 7)]);
        assert_eq!(b.base, 30);
        // Below the base (only a corrupt value does this): rebased down.
        let mut low = held(&[(10, 1), (20, 1)]);
        low.advance(0, push(5), None).unwrap();
        assert_eq!(pairs(&low), [(10, 1), (20, 1), (5, 7)]);
        assert_eq!(low.base, 5);
        // Everything expired: the pushed bucket becomes the base.
        b.advance(2, push(i64::MIN), None).unwrap();
        assert_eq!(pairs(&b), [(i64::MIN, 7)]);
        b.advance(0, Add::ToNewest(9), None).unwrap();
        b.advance(0, Add::Nothing, None).unwrap();
        assert_eq!(pairs(&b), [(i64::MIN, 9)]);
        b.advance(1, Add::Nothing, None).unwrap();
        assert_eq!(b.len(), 0);
        // Equality ignores the base.
        let mut x = held(&[(1, 1), (2, 1)]);
        x.advance(1, push(3), None).unwrap();
        assert_eq!(x.base, 1);
        assert_eq!(x, held(&[(2, 1), (3, 7)]));
        assert_ne!(x, held(&[(2, 1), (3, 8)]));
    }

    #[test]
    fn buckets_serialize_as_a_deque_of_buckets() {
        use bincode::Options;
        let opts = bincode::DefaultOptions::new();
        let seq = vec![(-3, 1), (0, i64::MAX), (70_000, 2), (1 << 31, -4)];
        let mut b = held(&[(-100, 5)]);
        for &(index, count) in &seq {
            b.advance(0, Add::Push(Bucket { index, count }), None)
                .unwrap();
        }
        b.advance(1, Add::Nothing, None).unwrap();
        let deque: VecDeque<Bucket> = seq
            .iter()
            .map(|&(index, count)| Bucket { index, count })
            .collect();
        let bytes = opts.serialize(&b).unwrap();
        assert_eq!(bytes, opts.serialize(&deque).unwrap());
        let back: Buckets = opts.deserialize(&bytes).unwrap();
        assert_eq!(back, b);
        let narrow = seq.iter().all(|&(_, c)| u32::try_from(c).is_ok());
        assert_eq!(back.heap_bytes(), if narrow { 8 } else { 12 } * seq.len());
        // Out of order is kept (validate refuses it); too wide cannot be held.
        let odd: VecDeque<Bucket> = [(5, 1), (2, 1)]
            .iter()
            .map(|&(index, count)| Bucket { index, count })
            .collect();
        let back: Buckets = opts.deserialize(&opts.serialize(&odd).unwrap()).unwrap();
        assert_eq!(pairs(&back), [(5, 1), (2, 1)]);
        let wide: VecDeque<Bucket> = [(0, 1), (1 << 33, 1)]
            .iter()
            .map(|&(index, count)| Bucket { index, count })
            .collect();
        let bytes = opts.serialize(&wide).unwrap();
        assert!(opts.deserialize::<Buckets>(&bytes).is_err());
    }

    #[test]
    fn finer_precision_after_a_long_horizon_converts_then_expires() {
        // Held times 0 and 2^39 are 2^39 one-ms buckets apart: more than
        // `Buckets` can hold, until the 1 s horizon of the new call drops the first.
        let long = params(10, 1 << 40, 1 << 28, 1);
        let mut w = Window::new(&long, 0);
        call(&mut w, &long, 0);
        call(&mut w, &long, 1 << 39);
        assert_eq!(w.bucket_count(), 2);
        let fine = params(10, 1000, 1, 1);
        assert_eq!(
            call(&mut w, &fine, (1 << 39) + 1),
            decision(true, 8, 0, 1000)
        );
        assert_eq!(pairs(&w.buckets), [(1 << 39, 1), ((1 << 39) + 1, 1)]);
        assert_eq!(w.horizon_ms(), 4096);
    }

    #[test]
    fn a_long_lived_base_is_rebased_on_the_kept_buckets() {
        // As after ~2^32 ms of steady 1 ms traffic: the base lags the oldest
        // held bucket by almost u32::MAX.
        let p = params(10, 100, 1, 1);
        let plain = Window {
            window_ms: 100,
            precision_ms: 1,
            horizon_ms: 100,
            last_ms: 1_000_000,
            buckets: held(&[(999_950, 1), (1_000_000, 2)]),
            extras: None,
        };
        plain.validate().unwrap();
        let mut lagging = plain.clone();
        let lag = i64::from(u32::MAX) - 60;
        lagging.buckets.base -= lag;
        for o in &mut lagging.buckets.offsets {
            *o += u32::try_from(lag).unwrap();
        }
        assert_eq!(lagging, plain);
        lagging.validate().unwrap();
        let mut w = plain.clone();
        for t in [1_000_010, 1_000_049, 1_000_070, 1_000_090] {
            assert_eq!(call(&mut lagging, &p, t), call(&mut w, &p, t));
            assert_eq!(lagging, w);
        }
        // 1_000_010 landed exactly u32::MAX past the base; 1_000_049 did not
        // fit and rebased on the oldest bucket kept then (999_950).
        assert_eq!(lagging.buckets.base, 999_950);
        assert_eq!(
            pairs(&lagging.buckets),
            [
                (1_000_000, 2),
                (1_000_010, 1),
                (1_000_049, 1),
                (1_000_070, 1),
                (1_000_090, 1)
            ]
        );
    }

    #[test]
    fn storage_fits_a_full_window_exactly() {
        // 60 s at 1 s, one call every 100 ms for 3 minutes: 61 buckets held,
        // storage grown to exactly that budget (8 bytes each: the counts fit a u32).
        let p = params(i64::MAX, 60_000, 1000, 1);
        let mut w = Window::new(&p, 0);
        for t in (0..180_000).step_by(100) {
            w.record(&p, t).unwrap();
            assert!(w.heap_bytes() <= 61 * 8);
        }
        assert_eq!(w.bucket_count(), 61);
        assert_eq!(w.heap_bytes(), 61 * 8);
        // A count beyond u32 widens the counts to 8 bytes, in place.
        let big = params(i64::MAX, 60_000, 1000, i64::from(u32::MAX) + 1);
        w.record(&big, 180_000).unwrap();
        w.validate().unwrap();
        assert_eq!(w.heap_bytes(), 61 * 12);
        w.record(&p, 180_001).unwrap();
        w.validate().unwrap();
        w.validate().unwrap();
    }

    #[test]
    fn memory_is_bounded_under_saturating_traffic() {
        let p = params(i64::MAX, 4096, 1, 1);
        let mut w = Window::new(&p, 0);
        // One event per ms for 1.5 windows: every bucket fills, old ones leave.
        for t in 0..6144 {
            w.record(&p, t).unwrap();
            assert!(w.bucket_count() <= 4097);
        }
        w.validate().unwrap();
        assert_eq!(w.bucket_count(), 4096);
        assert!(w.heap_bytes() <= (2 * 4097 + CAPACITY_SLACK) * 16);
        assert!(w.heap_bytes() <= 4097 * 12);
        // Coarser precision merges the held buckets, and the heap follows.
        let coarse = params(i64::MAX, 4096, 64, 1);
        w.record(&coarse, 6144).unwrap();
        w.validate().unwrap();
        assert!(w.bucket_count() <= 65);
        assert!(w.heap_bytes() <= (2 * 65 + CAPACITY_SLACK) * 16);
        assert!(w.heap_bytes() <= (65 + 65 / 2 + CAPACITY_SLACK) * 12);
    }

    // ---- property tests ----

    /// Naive reference: every admitted event, bucketed the same way.
    struct Model {
        window_ms: i64,
        precision_ms: i64,
        last_ms: i64,
        events: Vec<(i64, i64)>,
    }

    impl Model {
        fn exit(&self, t: i64) -> i64 {
            t.div_euclid(self.precision_ms) * self.precision_ms + self.precision_ms - 1
                + self.window_ms
        }

        fn counted(&self, t: i64) -> i64 {
            self.events
                .iter()
                .filter(|(e, _)| self.exit(*e) > t)
                .map(|(_, c)| c)
                .sum()
        }

        fn decide(&self, limit: i64, cost: i64, raw: i64) -> WindowDecision {
            let t = raw.max(self.last_ms);
            let counted = self.counted(t);
            let mut exits: Vec<i64> = self
                .events
                .iter()
                .map(|(e, _)| self.exit(*e))
                .filter(|x| *x > t)
                .collect();
            exits.sort_unstable();
            let reset = exits.last().map_or(0, |x| x - raw);
            let allowed = counted + cost <= limit;
            let retry = if allowed {
                0
            } else if cost > limit {
                -1
            } else {
                let at = exits
                    .iter()
                    .find(|x| self.counted(**x) + cost <= limit)
                    .unwrap();
                assert!(self.counted(at - 1) + cost > limit);
                at - raw
            };
            decision(allowed, (limit - counted).max(0), retry, reset)
        }
    }

    fn window_and_precision() -> impl Strategy<Value = (i64, i64)> {
        (1..=300i64).prop_flat_map(|w| (Just(w), 1..=w))
    }

    fn time_step() -> impl Strategy<Value = i64> {
        prop_oneof![
            3 => Just(0i64),
            6 => 0..20i64,
            4 => 0..400i64,
            1 => 1000..100_000i64,
            1 => -60..0i64,
        ]
    }

    #[test]
    fn the_bucket_bound_is_the_ceiling_rule() {
        let m = MAX_BUCKETS;
        for (w, p) in [
            (m, 1),
            (m + 1, 1),
            (2 * m, 2),
            (2 * m + 1, 2),
            (i64::MAX, i64::MAX / m),
            (i64::MAX, i64::MAX / m + 1),
            (i64::MAX, i64::MAX),
            (1000, 1),
            (60_000, 1000),
        ] {
            let by_ceiling = ceil_div(w, p).is_some_and(|span| span <= m);
            assert_eq!(check_precision(w, p).is_ok(), by_ceiling, "{w} / {p}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// A count in the newest bucket (`record_in_newest`) reaches the very state, and
        /// result, of the planned record, whatever came before: new buckets, buckets leaving
        /// the window, another window or precision, ids or none, zero costs, time going back.
        #[test]
        fn the_newest_bucket_path_equals_the_plan(
            (window_ms, precision_ms) in window_and_precision(),
            start in 0..1000i64,
            steps in prop::collection::vec(
                (-3..12i64, 0..5i64, any::<bool>(), 0..10u8), 1..120),
        ) {
            let mut fast = Window::new(&params(0, window_ms, precision_ms, 0), start);
            fast.extras_mut().config = Some(WindowConfig::parse(100, window_ms, Some(precision_ms)).unwrap());
            let mut planned = fast.clone();
            let mut now = start;
            for (n, (dt, cost, with_id, shape)) in steps.into_iter().enumerate() {
                now += dt;
                // Mostly the held window and precision; sometimes another.
                let (w, p) = match shape {
                    0 => (window_ms.saturating_mul(2), precision_ms),
                    1 => (window_ms, 1),
                    _ => (window_ms, precision_ms),
                };
                let p = params(0, w, p, cost);
                let id = format!("{now}-{n}");
                let id = with_id.then_some(id.as_bytes());
                let a = fast.record_state(&p, now, id);
                let b = p.validate().and_then(|()| planned.record_planned(&p, now, id));
                prop_assert_eq!(a, b);
                prop_assert_eq!(&fast, &planned);
            }
        }

        /// The held-bucket decision (a binary search for the window's edge, then a sum on
        /// its shorter side with the cached total) equals a pass over every bucket, with the
        /// edge anywhere: before, inside or after the buckets.
        #[test]
        fn held_decision_equals_a_full_pass(
            gaps in prop::collection::vec((1..5i64, 1..6i64), 0..70),
            window_ms in 4..=80i64,
            precision_ms in 1..=4i64,
            now in 0..400i64,
            limit in 0..60i64,
            cost in 0..6i64,
            recorded: bool,
        ) {
            let mut index = 0;
            let pairs: Vec<(i64, i64)> = gaps
                .iter()
                .map(|&(gap, count)| {
                    index += gap;
                    (index, count)
                })
                .collect();
            let b = held(&pairs);
            prop_assert_eq!(b.total, pairs.iter().map(|&(_, c)| i128::from(c)).sum::<i128>());
            let p = params(limit, window_ms, precision_ms, cost);
            prop_assert_eq!(
                decide_held(&b, &Ask { recorded, ..Ask::new(&p, now, now) }),
                decide(b.iter(), &Ask { recorded, ..Ask::new(&p, now, now) })
            );
        }

        /// (1) Same decisions as the naive model; (3) retry honoured and exact.
        #[test]
        fn matches_reference_model(
            (window_ms, precision_ms) in window_and_precision(),
            start in -1000..1000i64,
            steps in prop::collection::vec((time_step(), 0..4i64, 0..8i64), 1..80),
        ) {
            let mut model = Model { window_ms, precision_ms, last_ms: start, events: vec![] };
            let first = params(0, window_ms, precision_ms, 0);
            let mut w = Window::new(&first, start);
            let mut raw = start;
            for (dt, cost, limit) in steps {
                raw += dt;
                let p = params(limit, window_ms, precision_ms, cost);
                let expected = model.decide(limit, cost, raw);
                let got = w.check(&p, raw).unwrap();
                prop_assert_eq!(got, expected);
                if got.allowed {
                    let t = raw.max(model.last_ms);
                    if cost > 0 {
                        model.events.push((t, cost));
                    }
                    model.last_ms = t;
                    let after = record_both_ways(&mut w, &p, raw, &got);
                    let mut want = model.decide(limit, 0, raw);
                    want.allowed = true;
                    want.retry_after_ms = 0;
                    prop_assert_eq!(after, want);
                    prop_assert!(w.validate().is_ok());
                } else if got.retry_after_ms > 0 {
                    let r = got.retry_after_ms;
                    prop_assert!(w.check(&p, raw + r).unwrap().allowed);
                    prop_assert!(!w.check(&p, raw + r - 1).unwrap().allowed);
                }
            }
        }

        /// (2) Safety against an exact log under changing limit, window and
        /// precision, including key expiry at `empty_at_ms`: the documented
        /// bound over (max(t - W, F), t]. (3) retry honoured and exact after
        /// any history. (4) buckets and heap bounded after every record.
        #[test]
        fn never_over_admits_across_param_changes(
            start in -1000..1000i64,
            steps in prop::collection::vec(
                (time_step(), 0..4i64, 0..8i64, 1..=400i64, 0..400i64),
                1..80,
            ),
        ) {
            let mut state: Option<Window> = None;
            let mut forget = i64::MIN;
            let mut log: Vec<(i64, i64)> = vec![];
            let mut raw = start;
            for (dt, cost, limit, window_ms, seed) in steps {
                raw += dt;
                let precision_ms = 1 + seed % window_ms;
                let p = params(limit, window_ms, precision_ms, cost);
                if let Some(w) = &state {
                    match w.empty_at_ms() {
                        Some(at) if raw > at => {
                            forget = forget.max(at - w.horizon_ms());
                            state = None;
                        }
                        None => state = None,
                        _ => {}
                    }
                }
                let w = state.get_or_insert_with(|| Window::new(&p, raw));
                let t = raw.max(w.last_ms());
                let d = w.check(&p, raw).unwrap();
                if d.allowed {
                    let held: i64 = log
                        .iter()
                        .filter(|(e, _)| *e > (t - window_ms).max(forget) && *e <= t)
                        .map(|(_, c)| c)
                        .sum();
                    prop_assert!(held + cost <= limit, "over-admitted at {}", t);
                    record_both_ways(w, &p, raw, &d);
                    log.push((t, cost));
                    forget = forget.max(t - w.horizon_ms());
                    prop_assert!(w.validate().is_ok());
                    let max = max_len(w.horizon_ms(), w.precision_ms()).unwrap();
                    prop_assert!(w.bucket_count() <= max && max <= 4097);
                    prop_assert!(w.heap_bytes() <= (2 * max + CAPACITY_SLACK) * 16);
                    prop_assert!(w.heap_bytes() <= (max + max / 2 + CAPACITY_SLACK) * 12);
                } else if d.retry_after_ms > 0 {
                    let r = d.retry_after_ms;
                    prop_assert!(w.check(&p, raw + r).unwrap().allowed);
                    prop_assert!(!w.check(&p, raw + r - 1).unwrap().allowed);
                }
            }
        }

        /// (2) The full exact-log bound when the window never exceeds the
        /// first (largest) one: shrink, regrow and precision changes are safe.
        #[test]
        fn exact_bound_when_window_stays_within_horizon(
            first_window in 1..=400i64,
            start in -1000..1000i64,
            steps in prop::collection::vec(
                (time_step(), 0..4i64, 0..8i64, 0..400i64, 0..400i64),
                1..80,
            ),
        ) {
            let mut w = Window::new(&params(0, first_window, 1, 0), start);
            let mut log: Vec<(i64, i64)> = vec![];
            let mut raw = start;
            for (dt, cost, limit, wseed, pseed) in steps {
                raw += dt;
                let window_ms = 1 + wseed % first_window;
                let precision_ms = 1 + pseed % window_ms;
                let p = params(limit, window_ms, precision_ms, cost);
                let t = raw.max(w.last_ms());
                if w.check(&p, raw).unwrap().allowed {
                    let held: i64 = log
                        .iter()
                        .filter(|(e, _)| *e > t - window_ms && *e <= t)
                        .map(|(_, c)| c)
                        .sum();
                    prop_assert!(held + cost <= limit, "over-admitted at {}", t);
                    w.record(&p, raw).unwrap();
                    log.push((t, cost));
                }
            }
        }

        /// Any field values: validate, check and record never panic, and
        /// whatever validates can be used.
        #[test]
        fn arbitrary_values_never_panic(
            window_ms in any::<i64>(),
            precision_ms in any::<i64>(),
            horizon_ms in any::<i64>(),
            last_ms in any::<i64>(),
            buckets in prop::collection::vec((any::<i64>(), any::<i64>()), 0..6),
            // Indexes near one centre (else any two rarely fit one value):
            // (use the raw index, offset from the centre, count).
            near in prop::collection::vec((any::<bool>(), -5000..5000i64, any::<i64>()), 0..6),
            centre_at_last in any::<bool>(),
            centre in any::<i64>(),
            limit in any::<i64>(),
            pw in any::<i64>(),
            pp in any::<i64>(),
            cost in any::<i64>(),
            now in any::<i64>(),
        ) {
            let raw = || buckets.iter().map(|&(index, count)| Bucket { index, count });
            // Whatever the indexes: held, or refused as a deserializer would.
            let _ = Buckets::from_buckets(raw());
            let centre = if centre_at_last {
                last_ms.checked_div_euclid(precision_ms).unwrap_or(centre)
            } else {
                centre
            };
            let near = near.iter().zip(buckets.iter()).map(|(&(use_raw, delta, count), &(index, _))| {
                let index = if use_raw { index } else { centre.saturating_add(delta) };
                Bucket { index, count }
            });
            let Ok(held) = Buckets::from_buckets(near.clone().chain(raw()))
                .or_else(|_| Buckets::from_buckets(near)) else {
                return Ok(());
            };
            let mut w = Window {
                window_ms,
                precision_ms,
                horizon_ms,
                last_ms,
                buckets: held,
                extras: None,
            };
            let _ = w.validate();
            let _ = w.empty_at_ms();
            let p = WindowParams { limit, window_ms: pw, precision_ms: pp, cost };
            let _ = w.check(&p, now);
            let _ = w.record(&p, now);
            if let Ok(p) = WindowParams::parse(limit, pw, Some(cost), None) {
                let _ = w.check(&p, now);
                let _ = w.record(&p, now);
                let _ = w.validate();
            }
        }
    }

    fn configured(limit: i64, window_ms: i64, precision_ms: i64, now: i64) -> Window {
        let cfg = WindowConfig::parse(limit, window_ms, Some(precision_ms)).unwrap();
        let mut w = Window::new(&cfg.params(0), now);
        w.apply(now, &WindowEffect::Configure(cfg)).unwrap();
        w
    }

    fn count_id(w: &mut Window, now: i64, id: &[u8], cost: i64) {
        let cfg = *w.config().unwrap();
        let plan = w.plan_id_reserve(now, id, cost, i64::MAX).unwrap();
        assert!(matches!(plan, IdPlan::Grant(_)), "{plan:?}");
        w.apply(
            now,
            &WindowEffect::Count {
                window_ms: cfg.window_ms,
                precision_ms: cfg.precision_ms,
                cost,
                id: Some(id.into()),
            },
        )
        .unwrap();
    }

    /// The cap on remembered ids counts only the ids still inside the window: ids whose
    /// bucket has left it are gone even before a record forgets them physically.
    #[test]
    fn the_id_cap_counts_only_live_ids() {
        let mut w = configured(1000, 1000, 100, 10_000);
        for (i, id) in [b"a", b"b", b"c"].iter().enumerate() {
            count_id(&mut w, 10_001 + i as i64, *id, 1);
        }
        assert_eq!(w.remembered().len(), 3);
        assert!(matches!(
            w.plan_id_reserve(10_500, b"d", 1, 3),
            Err(LedgerError::TooManyRemembered { max: 3 })
        ));
        // At 11 100 their bucket (10 000..=10 099) has left the 1-s window: none is live.
        assert!(matches!(
            w.plan_id_reserve(11_100, b"d", 1, 3),
            Ok(IdPlan::Grant(_))
        ));
        assert!(matches!(
            w.plan_id_reserve(11_100, b"d", 1, 1),
            Ok(IdPlan::Grant(_))
        ));
        assert_eq!(w.remembered().len(), 3);
    }

    /// Ids follow their buckets through a precision change (the rule of `rebucketed`), so a
    /// later correction lands in the bucket that holds the amount; counts stay consistent.
    #[test]
    fn ids_follow_their_buckets_through_a_precision_change() {
        let mut w = configured(1000, 60_000, 1000, 10_000);
        count_id(&mut w, 10_100, b"a", 300);
        count_id(&mut w, 11_500, b"b", 200);
        count_id(&mut w, 11_700, b"c", 50);
        assert_eq!(w.remembered().get(b"b").unwrap().index, 11);
        // Precision 10 s: buckets 10 and 11 (ms up to 11 999, clamped to last_ms 11 700) both
        // move into bucket 1.
        let coarse = WindowConfig::parse(1000, 60_000, Some(10_000)).unwrap();
        w.apply(12_000, &WindowEffect::Configure(coarse)).unwrap();
        w.validate().unwrap();
        assert!(w.remembered().iter().all(|(_, e)| e.index == 1));
        assert_eq!(w.counted(&coarse.params(0), 12_000).unwrap(), 550);
        // b settles with 20: 180 given back, in bucket 1.
        assert_eq!(
            w.plan_id_settle(12_000, b"b", 20).unwrap(),
            IdPlan::Corrected { delta: -180 }
        );
        w.apply(
            12_000,
            &WindowEffect::Settle {
                id: b"b"[..].into(),
                actual: 20,
            },
        )
        .unwrap();
        assert_eq!(w.counted(&coarse.params(0), 12_000).unwrap(), 370);
        // a and c rolled back: the bucket empties and is removed; a settle of a is skipped
        // (its count was given back).
        for id in [&b"a"[..], b"c"] {
            w.apply(12_000, &WindowEffect::Rollback { id: id.into() })
                .unwrap();
        }
        assert_eq!(w.counted(&coarse.params(0), 12_000).unwrap(), 20);
        assert_eq!(w.plan_id_settle(12_000, b"a", 1).unwrap(), IdPlan::Skipped);
        assert_eq!(w.plan_id_rollback(12_000, b"a").unwrap(), IdPlan::Duplicate);
        w.validate().unwrap();
        // A correction up into an emptied bucket inserts it again (counted 0 -> 5).
        let mut v = configured(100, 1000, 10, 0);
        count_id(&mut v, 5, b"z", 0);
        assert_eq!(v.bucket_count(), 0);
        v.apply(
            6,
            &WindowEffect::Settle {
                id: b"z"[..].into(),
                actual: 5,
            },
        )
        .unwrap();
        assert_eq!(v.bucket_count(), 1);
        assert_eq!(v.counted(&v.config().unwrap().params(0), 6).unwrap(), 5);
        v.validate().unwrap();
        // Once the bucket has left the window the id is gone: skipped, and a record forgets it.
        assert!(matches!(
            v.plan_id_settle(1008, b"z", 9),
            Err(LedgerError::Conflict { .. })
        ));
        assert_eq!(v.stale_ids(1008), 0);
        assert_eq!(v.plan_id_settle(1009, b"z", 9).unwrap(), IdPlan::Skipped);
        assert_eq!(v.stale_ids(1009), 1);
        assert_eq!(v.ids_due_ms(), Some(1009));
        v.apply(1009, &WindowEffect::Forget).unwrap();
        assert!(v.remembered().is_empty());
    }

    /// A loaded value whose ids break an invariant is refused.
    #[test]
    fn corrupt_ids_are_refused() {
        let mut w = configured(100, 1000, 10, 0);
        count_id(&mut w, 5, b"a", 3);
        w.validate().unwrap();
        let with = |entry: Entry| {
            let mut ids = Remembered::default();
            ids.put(b"a", entry).unwrap();
            w.clone().with_extras(w.config().copied(), ids)
        };
        let ok = Entry {
            index: 0,
            counted: 3,
            status: IdStatus::Pending,
        };
        with(ok).validate().unwrap();
        for bad in [
            Entry { counted: 4, ..ok },
            Entry { index: 1, ..ok },
            Entry { index: -200, ..ok },
            Entry { counted: -1, ..ok },
            Entry {
                status: IdStatus::RolledBack,
                ..ok
            },
        ] {
            assert!(with(bad).validate().is_err(), "{bad:?}");
        }
        // A record refused by an overflow is refused at planning, before anything changes.
        let mut big = configured(i64::MAX, 1000, 10, 0);
        count_id(&mut big, 5, b"x", i64::MAX - 1);
        assert_eq!(
            big.plan_id_settle(6, b"x", i64::MAX).unwrap(),
            IdPlan::Corrected { delta: 1 }
        );
        let mut other = big.clone();
        other
            .apply(
                6,
                &WindowEffect::Count {
                    window_ms: 1000,
                    precision_ms: 10,
                    cost: 1,
                    id: None,
                },
            )
            .unwrap();
        assert_eq!(
            other.plan_id_settle(6, b"x", i64::MAX),
            Err(LedgerError::Overflow)
        );
    }
}
