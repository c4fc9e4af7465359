//! The reservation book of one budget: pending reservations and remembered finished ids, with
//! the orders the ledger needs (by id for lookups and persistence, by deadline for expiry, by
//! finish time for forgetting). Storage only: the rules live in [`crate::core::ledger`].
//!
//! # Layout (why it is small)
//!
//! Each entry is stored once, packed, in one of two slabs addressed by `u32` handles: a pending
//! reservation in 49 bytes (id up to 16 bytes inline, amount, created, deadline, last
//! heartbeat), a finished id in 33 bytes (id, outcome, value, finish time). An expiry that
//! charged part of its amount (`ONEXPIRE ELAPSED`: a crashed, time-metered session) needs two
//! numbers; it keeps them in a side table, so no other finished id pays for them. Slabs grow in chunks of about 5 KiB (one
//! jemalloc size class, no doubling slack). A removed entry leaves a hole that the next insert
//! fills; holes are linked through their own bytes and kept at most about as many as the
//! entries by compacting a step or two per removal (the tail entry moves into a hole and its
//! handle is updated in the indexes, O(log n)), so a slab spans at most about twice its entries.
//!
//! The orders are [`HTree`]s of handles — B-trees that store 4-byte handles and compare
//! through the slabs — so an index costs about 5–8 bytes per entry instead of a copy of the id.
//! Four of them: pending ids, finished ids, deadlines, finish times. Pending and finished ids
//! are indexed apart so that a settle finds its (pending) id among the few pending ones, not
//! among every remembered id, and a lookup of an id above all (a generated id, a growing
//! client id) is one comparison; [`Book::entries`] merges the two into one id order.
//! Ids longer than 16 bytes live in a side store (one allocation each), referenced from the
//! slot.
//!
//! Orders are exactly those of the former `BTreeMap<id, entry>` / `BTreeSet<(time, id)>`: ids
//! compare as byte strings, times tie-break by id. So iteration order — and with it the
//! persisted bytes, digests, replies and the order effects are planned in — is deterministic
//! and the same on every server, whatever history built the slabs. Every operation is O(log n)
//! in the key's entries.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::fmt;

use crate::core::htree::{Found, HTree, Measure};

/// A reservation or charge id: 1..=max-id-length arbitrary bytes.
pub type Id = smallvec::SmallVec<[u8; 24]>;

/// A pending reservation. Times are unix ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// Units held back from `available` until settle, rollback or expiry.
    pub amount: i64,
    /// When it was granted.
    pub created_ms: i64,
    /// It expires when `now >= deadline_ms`.
    pub deadline_ms: i64,
    /// The last heartbeat (EXTEND); `created_ms` if it never had one.
    pub heartbeat_ms: i64,
}

impl Reservation {
    /// A reservation granted at `created_ms` that never had a heartbeat.
    pub fn new(amount: i64, created_ms: i64, deadline_ms: i64) -> Reservation {
        Reservation {
            amount,
            created_ms,
            deadline_ms,
            heartbeat_ms: created_ms,
        }
    }

    /// The time from the grant to the last heartbeat in units of `unit_ms`, rounded up once,
    /// at most `amount`: what an `ONEXPIRE ELAPSED` expiry charges. 0 without a heartbeat or a
    /// unit (`unit_ms <= 0`).
    pub fn elapsed_charge(&self, unit_ms: i64) -> i64 {
        ceil_units(self.heartbeat_ms.saturating_sub(self.created_ms), unit_ms).min(self.amount)
    }
}

/// `ms` in units of `unit_ms`, rounded up; 0 for `ms <= 0` or `unit_ms <= 0`. Never overflows:
/// the quotient is at most `ms`.
pub fn ceil_units(ms: i64, unit_ms: i64) -> i64 {
    if ms <= 0 || unit_ms <= 0 {
        return 0;
    }
    let q = ms.checked_div(unit_ms).unwrap_or(0);
    if ms.checked_rem(unit_ms).unwrap_or(0) == 0 {
        q
    } else {
        q.saturating_add(1)
    }
}

/// How a finished id ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Settled for `actual` units (`late`: after the reservation had expired).
    Settled { actual: i64, late: bool },
    /// Rolled back; `amount` was released.
    RolledBack { amount: i64 },
    /// Expired; `amount` was released and `charged` of it charged to `used` (0 under
    /// `ONEXPIRE RELEASE`, or when the charge fell in a period already reset).
    Expired { amount: i64, charged: i64 },
    /// A one-phase CHARGE with this id charged `amount`.
    Charged { amount: i64 },
}

impl Outcome {
    /// The state name used in replies and CONFLICT errors.
    pub fn state_name(&self) -> &'static str {
        match self {
            Outcome::Settled { .. } => "settled",
            Outcome::RolledBack { .. } => "rolledback",
            Outcome::Expired { .. } => "expired",
            Outcome::Charged { .. } => "charged",
        }
    }

    /// (kind code, value) as stored in a finished slot; `None`: an expiry that charged part
    /// of its amount, kept in the side table ([`KIND_EXPIRED_PART`]).
    fn pack(&self) -> Option<(u8, i64)> {
        Some(match *self {
            Outcome::Settled {
                actual,
                late: false,
            } => (0, actual),
            Outcome::Settled { actual, late: true } => (1, actual),
            Outcome::RolledBack { amount } => (2, amount),
            Outcome::Expired { amount, charged: 0 } => (3, amount),
            Outcome::Expired { amount, charged } if charged == amount => {
                (KIND_EXPIRED_FULL, amount)
            }
            Outcome::Expired { .. } => return None,
            Outcome::Charged { amount } => (4, amount),
        })
    }

    /// The outcome of kind code `kind` with `value` (not [`KIND_EXPIRED_PART`]).
    fn unpack(kind: u8, value: i64) -> Outcome {
        match kind {
            0 => Outcome::Settled {
                actual: value,
                late: false,
            },
            1 => Outcome::Settled {
                actual: value,
                late: true,
            },
            2 => Outcome::RolledBack { amount: value },
            3 => Outcome::Expired {
                amount: value,
                charged: 0,
            },
            KIND_EXPIRED_FULL => Outcome::Expired {
                amount: value,
                charged: value,
            },
            _ => Outcome::Charged { amount: value },
        }
    }
}

/// A remembered finished id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    pub outcome: Outcome,
    /// When it finished (for an expiry: the deadline, so that swept and unswept expiries are
    /// remembered for exactly as long). It is forgotten once `now >= finished_ms + keep`.
    pub finished_ms: i64,
}

/// One id's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    Pending(Reservation),
    Finished(Finished),
}

/// Ids up to this many bytes are stored inline in their slot.
const INLINE: usize = 16;
/// Low bits of a slot's `meta`: the inline id's length, or [`LONG`].
const LEN_MASK: u8 = 0x1f;
/// `meta` length of an id kept in the side store; the slot's first 4 id bytes index it.
const LONG: u8 = LEN_MASK;
/// High bits of `meta` in a finished slot: the outcome kind.
const KIND_SHIFT: u32 = 5;
/// Kind code of an expiry that charged its whole amount (`value`: the amount).
const KIND_EXPIRED_FULL: u8 = 5;
/// Kind code of an expiry that charged part of its amount: `value` is the index of
/// `(amount, charged, id)` in [`Store::wide`]. (Kind 7 with a long id would read as a hole.)
const KIND_EXPIRED_PART: u8 = 6;
/// Handles are below this (31 bits), as when both kinds shared one id index.
const HANDLE_LIMIT: u32 = 1 << 31;
/// Slots per slab chunk: 104 × 49 = 5096 and 155 × 33 = 5115 bytes, each within the 5120-byte
/// jemalloc class.
const PENDING_CHUNK: usize = 104;
const FINISHED_CHUNK: usize = 155;
/// Capacity of a slab's first chunk when it is created; it doubles up to the chunk size.
const FIRST_CHUNK: usize = 4;

/// A pending reservation, packed (49 bytes, no padding).
#[derive(Clone, Copy, Debug)]
struct PendingSlot {
    id: [u8; INLINE],
    meta: u8,
    amount: [u8; 8],
    created: [u8; 8],
    deadline: [u8; 8],
    heartbeat: [u8; 8],
}

/// A finished id, packed (33 bytes, no padding).
#[derive(Clone, Copy, Debug)]
struct FinishedSlot {
    id: [u8; INLINE],
    meta: u8,
    value: [u8; 8],
    finished: [u8; 8],
}

fn i64_of(b: [u8; 8]) -> i64 {
    i64::from_le_bytes(b)
}

/// The long-id table index a slot of a [`LONG`] id keeps in its first 4 id bytes.
fn long_index(bytes: &[u8; INLINE]) -> u32 {
    let [a, b, c, d, ..] = *bytes;
    u32::from_le_bytes([a, b, c, d])
}

fn set_long_index(bytes: &mut [u8; INLINE], index: u32) {
    if let Some(dst) = bytes.get_mut(..4) {
        dst.copy_from_slice(&index.to_le_bytes());
    }
}

/// `meta` of a slot that is a hole (no entry: neither kind of slot can have it, since ids are
/// at most [`LONG`] long and finished kinds are below 7).
const HOLE: u8 = 0xff;
/// No handle (ends of the list of holes).
const NIL: u32 = u32::MAX;

/// A slot that can be a hole: a link of the slab's doubly-linked list of holes, kept in the
/// hole's own id bytes (`prev`, then `next`), so holes cost no memory of their own.
trait Slot: Copy {
    fn meta(&self) -> u8;
    fn id(&self) -> &[u8; INLINE];
    /// A hole with zeroed fields and the given id bytes.
    fn hole_with(id: [u8; INLINE]) -> Self;

    fn hole(prev: u32, next: u32) -> Self {
        let ([a, b, c, d], [e, f, g, h]) = (prev.to_le_bytes(), next.to_le_bytes());
        Self::hole_with([a, b, c, d, e, f, g, h, 0, 0, 0, 0, 0, 0, 0, 0])
    }

    /// `(prev, next)` if this slot is a hole.
    fn links(&self) -> Option<(u32, u32)> {
        if self.meta() != HOLE {
            return None;
        }
        let [a, b, c, d, e, f, g, h, ..] = *self.id();
        Some((
            u32::from_le_bytes([a, b, c, d]),
            u32::from_le_bytes([e, f, g, h]),
        ))
    }
}

impl Slot for PendingSlot {
    fn meta(&self) -> u8 {
        self.meta
    }
    fn id(&self) -> &[u8; INLINE] {
        &self.id
    }
    fn hole_with(id: [u8; INLINE]) -> Self {
        PendingSlot {
            id,
            meta: HOLE,
            amount: [0; 8],
            created: [0; 8],
            deadline: [0; 8],
            heartbeat: [0; 8],
        }
    }
}

impl Slot for FinishedSlot {
    fn meta(&self) -> u8 {
        self.meta
    }
    fn id(&self) -> &[u8; INLINE] {
        &self.id
    }
    fn hole_with(id: [u8; INLINE]) -> Self {
        FinishedSlot {
            id,
            meta: HOLE,
            value: [0; 8],
            finished: [0; 8],
        }
    }
}

impl PendingSlot {
    fn deadline(&self) -> i64 {
        i64_of(self.deadline)
    }

    fn reservation(&self) -> Reservation {
        Reservation {
            amount: i64_of(self.amount),
            created_ms: i64_of(self.created),
            deadline_ms: self.deadline(),
            heartbeat_ms: i64_of(self.heartbeat),
        }
    }
}

impl FinishedSlot {
    fn finished(&self) -> i64 {
        i64_of(self.finished)
    }

    fn kind(&self) -> u8 {
        self.meta >> KIND_SHIFT
    }

    /// The side-table index of a [`KIND_EXPIRED_PART`] slot.
    fn wide_index(&self) -> Option<u32> {
        (self.kind() == KIND_EXPIRED_PART)
            .then(|| u32::try_from(i64_of(self.value)).ok())
            .flatten()
    }
}

/// The handle of slab position `len`, if it fits the handle space (31 bits).
fn handle_of(len: usize) -> Option<u32> {
    u32::try_from(len).ok().filter(|&h| h < HANDLE_LIMIT)
}

/// Storage in fixed-size chunks; handles are positions.
///
/// A removed entry leaves a hole, which the next insert fills (last made, first filled): a
/// removal moves no other entry and touches no index. Holes are kept few: while they
/// outnumber the entries (by more than [`SLACK`]), each removal is followed by up to two
/// compaction steps ([`Slab::compaction_step`]), each dropping a hole at the tail or moving
/// the tail entry into a hole (the caller re-points its index entries, O(log n)). So every
/// removal stays O(log n), and a slab spans at most about twice its entries (all storage is
/// given back with the last entry). Before, every removal moved the last entry into the hole:
/// two index searches per removal, at the cold far end of the indexes (issue 5, round 5).
#[derive(Clone, Debug)]
struct Slab<T, const CHUNK: usize> {
    chunks: Vec<Vec<T>>,
    /// Positions: entries and holes.
    len: usize,
    /// Holes, all below `len`.
    holes: usize,
    /// The last hole made (the head of the list of holes), or [`NIL`].
    free: u32,
}

/// Holes a slab may hold beyond its number of entries before removals compact it.
const SLACK: usize = 4;

/// One step of [`Slab::compaction_step`].
enum Step {
    /// A hole at the tail was dropped.
    Trimmed,
    /// The tail entry `from` is to move into the hole `to`: re-point its index entries, then
    /// [`Slab::finish_move`].
    Move { from: u32, to: u32 },
}

impl<T, const CHUNK: usize> Default for Slab<T, CHUNK> {
    fn default() -> Self {
        Slab {
            chunks: Vec::new(),
            len: 0,
            holes: 0,
            free: NIL,
        }
    }
}

impl<T: Slot, const CHUNK: usize> Slab<T, CHUNK> {
    fn at(h: usize) -> (usize, usize) {
        // CHUNK is a non-zero constant: neither can fail.
        (
            h.checked_div(CHUNK).unwrap_or(0),
            h.checked_rem(CHUNK).unwrap_or(0),
        )
    }

    fn get(&self, h: u32) -> Option<&T> {
        let (c, i) = Self::at(usize::try_from(h).ok()?);
        self.chunks.get(c)?.get(i)
    }

    fn get_mut(&mut self, h: u32) -> Option<&mut T> {
        let (c, i) = Self::at(usize::try_from(h).ok()?);
        self.chunks.get_mut(c)?.get_mut(i)
    }

    /// Entries held.
    fn live(&self) -> usize {
        self.len.saturating_sub(self.holes)
    }

    /// The handle the next [`Slab::push`] returns: the last hole made, else the end.
    fn next_handle(&self) -> Option<u32> {
        if self.free != NIL {
            return Some(self.free);
        }
        handle_of(self.len)
    }

    fn set_links(&mut self, h: u32, prev: u32, next: u32) {
        if let Some(slot) = self.get_mut(h) {
            *slot = T::hole(prev, next);
        }
    }

    /// Takes hole `h` out of the list of holes (O(1)); it is then free to be written.
    fn unlink(&mut self, h: u32) {
        let Some((prev, next)) = self.get(h).and_then(|s| s.links()) else {
            return;
        };
        if prev == NIL {
            self.free = next;
        } else if let Some((pp, _)) = self.get(prev).and_then(|s| s.links()) {
            self.set_links(prev, pp, next);
        }
        if next != NIL {
            if let Some((_, nn)) = self.get(next).and_then(|s| s.links()) {
                self.set_links(next, prev, nn);
            }
        }
        self.holes = self.holes.saturating_sub(1);
    }

    /// Stores `t` in the last hole made, else appends; `None` once 2^31 positions are used
    /// (the handle space).
    fn push(&mut self, t: T) -> Option<u32> {
        if self.free != NIL {
            let h = self.free;
            self.unlink(h);
            *self.get_mut(h)? = t;
            return Some(h);
        }
        let h = handle_of(self.len)?;
        let (c, _) = Self::at(self.len);
        if c == self.chunks.len() {
            let capacity = if c == 0 {
                FIRST_CHUNK.min(CHUNK)
            } else {
                CHUNK
            };
            self.chunks.push(Vec::with_capacity(capacity));
        }
        let chunk = self.chunks.get_mut(c)?;
        if chunk.len() == chunk.capacity() {
            // Only the first chunk starts small: double it, up to the chunk size.
            let room = CHUNK.saturating_sub(chunk.capacity());
            chunk.reserve_exact(chunk.capacity().max(1).min(room).max(1));
        }
        chunk.push(t);
        self.len = self.len.saturating_add(1);
        Some(h)
    }

    /// Where [`Slab::push`] will store the next entry (the last hole made, else the next
    /// position of the last chunk, if it has room), for prefetching: an address only.
    fn next_address(&self) -> Option<*const u8> {
        if self.free != NIL {
            return self
                .get(self.free)
                .map(|t| std::ptr::from_ref::<T>(t).cast());
        }
        let (c, i) = Self::at(self.len);
        let chunk = self.chunks.get(c)?;
        (i < chunk.capacity()).then(|| chunk.as_ptr().wrapping_add(i).cast())
    }

    /// Removes the entry at `h`, leaving a hole (all storage is given back with the last
    /// entry). Returns the removed entry. The caller must have taken `h` out of every index,
    /// and then runs [`Slab::compaction_step`]s.
    fn remove(&mut self, h: u32) -> Option<T> {
        let removed = *self.get(h)?;
        if removed.links().is_some() {
            return None;
        }
        if self.live() <= 1 {
            *self = Slab::default();
            return Some(removed);
        }
        let head = self.free;
        if head != NIL {
            if let Some((_, next)) = self.get(head).and_then(|s| s.links()) {
                self.set_links(head, h, next);
            }
        }
        self.set_links(h, NIL, head);
        self.free = h;
        self.holes = self.holes.saturating_add(1);
        Some(removed)
    }

    /// While holes outnumber entries by more than [`SLACK`]: drop a hole at the tail, or plan
    /// the move of the tail entry into the last hole made. `None`: nothing to do.
    fn compaction_step(&mut self) -> Option<Step> {
        if self.holes <= self.live().saturating_add(SLACK) {
            return None;
        }
        let tail = u32::try_from(self.len.checked_sub(1)?).ok()?;
        if self.get(tail)?.links().is_some() {
            self.unlink(tail);
            self.pop_tail();
            return Some(Step::Trimmed);
        }
        // Every hole is below the tail, which holds an entry.
        Some(Step::Move {
            from: tail,
            to: self.free,
        })
    }

    /// Moves the tail entry `from` into hole `to` (a [`Step::Move`] whose index entries now
    /// point at `to`).
    fn finish_move(&mut self, from: u32, to: u32) {
        let Some(&t) = self.get(from) else {
            return;
        };
        self.unlink(to);
        if let Some(slot) = self.get_mut(to) {
            *slot = t;
        }
        self.pop_tail();
    }

    /// Drops the last position (an entry moved away, or a hole already unlinked).
    fn pop_tail(&mut self) {
        let Some(last) = self.len.checked_sub(1) else {
            return;
        };
        let (c, _) = Self::at(last);
        if let Some(chunk) = self.chunks.get_mut(c) {
            chunk.pop();
            if chunk.is_empty() {
                self.chunks.truncate(c);
                // The table of chunks shrinks with them (24 bytes a chunk at the peak).
                let n = self.chunks.len();
                if self.chunks.capacity() > n.saturating_mul(2).saturating_add(4) {
                    self.chunks.shrink_to(n.saturating_add(n / 2));
                }
            } else if c == 0
                && chunk.capacity() > FIRST_CHUNK
                && chunk.len() <= chunk.capacity() / 4
            {
                chunk.shrink_to(chunk.len().saturating_mul(2));
            }
        }
        self.len = last;
    }

    /// Checks the list of holes and the bound on holes; for tests.
    fn check(&self) -> Result<(), &'static str> {
        let stored: usize = self.chunks.iter().map(Vec::len).sum();
        if stored != self.len {
            return Err("slab chunks and length differ");
        }
        let (mut h, mut prev, mut seen) = (self.free, NIL, 0usize);
        while h != NIL {
            let Some((p, next)) = self.get(h).and_then(|s| s.links()) else {
                return Err("a listed hole is not a hole");
            };
            if p != prev || seen >= self.holes {
                return Err("the list of holes is broken");
            }
            (prev, h, seen) = (h, next, seen.saturating_add(1));
        }
        let marked = (0..self.len)
            .filter_map(|i| u32::try_from(i).ok())
            .filter(|&i| self.get(i).is_some_and(|s| s.links().is_some()))
            .count();
        if seen != self.holes || marked != self.holes {
            return Err("hole count differs from the holes");
        }
        if self.holes > self.live().saturating_add(SLACK + 2) {
            return Err("too many holes");
        }
        Ok(())
    }

    /// Calls `f(requested bytes)` for each allocation.
    fn allocations(&self, f: &mut impl FnMut(usize, usize)) {
        if self.chunks.capacity() > 0 {
            f(
                self.chunks
                    .capacity()
                    .saturating_mul(std::mem::size_of::<Vec<T>>()),
                1,
            );
        }
        for chunk in &self.chunks {
            f(chunk.capacity().saturating_mul(std::mem::size_of::<T>()), 1);
        }
    }
}

/// Ids longer than [`INLINE`] bytes, one allocation each, at stable indexes.
///
/// A new id takes the lowest free index, so live ids gather at the front, and the table gives
/// back its tail as soon as the ids there are gone. One id left at a high index would still
/// pin the table at its peak, so while holes outnumber ids (by more than 16) each removal from
/// the book moves up to two ids from the tail into the lowest holes ([`Book::compact_long_ids`]):
/// the table follows the number of long ids the key holds, not its peak (both cases found by
/// break-test helpers).
#[derive(Clone, Debug, Default)]
struct LongIds {
    slots: Vec<Option<Box<[u8]>>>,
    /// Free indexes, lowest first. May hold indexes at or past `slots.len()` after the tail was
    /// given back: skipped when popped, dropped when they outnumber the real ones.
    free: BinaryHeap<Reverse<u32>>,
    live: usize,
}

impl LongIds {
    fn get(&self, i: u32) -> &[u8] {
        usize::try_from(i)
            .ok()
            .and_then(|i| self.slots.get(i))
            .and_then(|s| s.as_deref())
            .unwrap_or(&[])
    }

    fn add(&mut self, id: &[u8]) -> Option<u32> {
        let boxed: Box<[u8]> = id.into();
        while let Some(Reverse(i)) = self.free.pop() {
            if let Some(slot @ None) = usize::try_from(i).ok().and_then(|i| self.slots.get_mut(i)) {
                *slot = Some(boxed);
                self.live = self.live.saturating_add(1);
                return Some(i);
            }
        }
        let i = u32::try_from(self.slots.len()).ok()?;
        self.slots.push(Some(boxed));
        self.live = self.live.saturating_add(1);
        Some(i)
    }

    fn remove(&mut self, i: u32) {
        let Some(slot) = usize::try_from(i).ok().and_then(|i| self.slots.get_mut(i)) else {
            return;
        };
        if slot.take().is_none() {
            return;
        }
        self.live = self.live.saturating_sub(1);
        if self.live == 0 {
            *self = LongIds::default();
            return;
        }
        self.free.push(Reverse(i));
        self.tidy();
    }

    /// Gives back the free tail (amortized O(1): each slot is popped once per push), stale
    /// free entries and spare capacity.
    fn tidy(&mut self) {
        while matches!(self.slots.last(), Some(None)) {
            self.slots.pop();
        }
        let len = self.slots.len();
        let holes = len.saturating_sub(self.live);
        if self.free.len() > holes.saturating_mul(2).saturating_add(16) {
            // Mostly stale entries past the tail: keep the real holes only.
            let free = std::mem::take(&mut self.free);
            let mut kept: BinaryHeap<Reverse<u32>> = free
                .into_iter()
                .filter(|Reverse(h)| usize::try_from(*h).is_ok_and(|h| h < len))
                .collect();
            // The collect reuses the old buffer: give it back.
            kept.shrink_to_fit();
            self.free = kept;
        }
        if self.slots.capacity() > len.saturating_mul(2).saturating_add(8) {
            self.slots.shrink_to(len.saturating_add(len / 2));
        }
    }

    /// While holes outnumber ids by more than 16: `(from, to)`, the last id (the tail is never
    /// free) and the lowest hole, for [`Book::compact_long_ids`].
    fn next_move(&mut self) -> Option<(u32, u32)> {
        let len = self.slots.len();
        if len.saturating_sub(self.live) <= self.live.saturating_add(16) {
            return None;
        }
        let to = loop {
            let &Reverse(i) = self.free.peek()?;
            match usize::try_from(i).ok().and_then(|u| self.slots.get(u)) {
                Some(None) => break i,
                // Stale: past the tail.
                _ => {
                    self.free.pop();
                }
            }
        };
        let from = u32::try_from(len.checked_sub(1)?).ok()?;
        (to < from).then_some((from, to))
    }

    /// Moves the id at `from` into the hole `to` (a move of [`LongIds::next_move`], whose
    /// hole is the free heap's minimum). False, and nothing changed, if they are not an id and
    /// a hole.
    fn relocate(&mut self, from: u32, to: u32) -> bool {
        let (Ok(f), Ok(t)) = (usize::try_from(from), usize::try_from(to)) else {
            return false;
        };
        if self.free.peek() != Some(&Reverse(to))
            || !matches!(self.slots.get(t), Some(None))
            || !matches!(self.slots.get(f), Some(Some(_)))
        {
            return false;
        }
        let id = self.slots.get_mut(f).and_then(Option::take);
        if let Some(slot) = self.slots.get_mut(t) {
            *slot = id;
        }
        self.free.pop();
        self.tidy();
        true
    }

    fn allocations(&self, f: &mut impl FnMut(usize, usize)) {
        if self.slots.capacity() > 0 {
            f(
                self.slots
                    .capacity()
                    .saturating_mul(std::mem::size_of::<Option<Box<[u8]>>>()),
                1,
            );
        }
        if self.free.capacity() > 0 {
            f(
                self.free
                    .capacity()
                    .saturating_mul(std::mem::size_of::<Reverse<u32>>()),
                1,
            );
        }
        for id in self.slots.iter().flatten() {
            f(id.len(), 1);
        }
    }
}

/// The slabs: what the indexes' handles point into.
#[derive(Clone, Debug, Default)]
struct Store {
    pending: Slab<PendingSlot, PENDING_CHUNK>,
    finished: Slab<FinishedSlot, FINISHED_CHUNK>,
    longs: LongIds,
    /// Expiries that charged part of their amount: `amount`, `charged` (8 bytes each, little
    /// endian) then the id, at stable indexes ([`KIND_EXPIRED_PART`] slots name them). The id
    /// lets compaction find the slot that names an entry it moves.
    wide: LongIds,
    /// The budget's UNIT in ms (0: none), with which the deadline index sums elapsed charges.
    unit_ms: i64,
}

impl Store {
    fn id<'a>(&'a self, bytes: &'a [u8; INLINE], meta: u8) -> &'a [u8] {
        let len = meta & LEN_MASK;
        if len == LONG {
            self.longs.get(long_index(bytes))
        } else {
            bytes.get(..usize::from(len)).unwrap_or(&[])
        }
    }

    fn pending_slot(&self, h: u32) -> Option<&PendingSlot> {
        self.pending.get(h)
    }

    fn finished_slot(&self, h: u32) -> Option<&FinishedSlot> {
        self.finished.get(h)
    }

    fn pending_id(&self, h: u32) -> &[u8] {
        self.pending_slot(h).map_or(&[], |s| self.id(&s.id, s.meta))
    }

    fn finished_id(&self, h: u32) -> &[u8] {
        self.finished_slot(h)
            .map_or(&[], |s| self.id(&s.id, s.meta))
    }

    /// Orders by deadline, then id.
    fn pending_key(&self, h: u32) -> (i64, &[u8]) {
        match self.pending_slot(h) {
            Some(s) => (s.deadline(), self.id(&s.id, s.meta)),
            None => (i64::MIN, &[]),
        }
    }

    /// Orders by finish time, then id.
    fn finished_key(&self, h: u32) -> (i64, &[u8]) {
        match self.finished_slot(h) {
            Some(s) => (s.finished(), self.id(&s.id, s.meta)),
            None => (i64::MIN, &[]),
        }
    }

    /// The inline bytes and meta length of `id`, storing it aside if it is long.
    fn encode_id(&mut self, id: &[u8]) -> Option<([u8; INLINE], u8)> {
        let mut bytes = [0u8; INLINE];
        if let Some(dst) = bytes.get_mut(..id.len()) {
            dst.copy_from_slice(id);
            return Some((bytes, u8::try_from(id.len()).ok()?));
        }
        let index = self.longs.add(id)?;
        set_long_index(&mut bytes, index);
        Some((bytes, LONG))
    }

    /// The id bytes and meta of pending (or finished) slot `h`.
    fn slot_id_mut(&mut self, pending: bool, h: u32) -> Option<(&mut [u8; INLINE], u8)> {
        if pending {
            self.pending.get_mut(h).map(|s| (&mut s.id, s.meta))
        } else {
            self.finished.get_mut(h).map(|s| (&mut s.id, s.meta))
        }
    }

    fn release_id(&mut self, bytes: &[u8; INLINE], meta: u8) {
        if meta & LEN_MASK == LONG {
            self.longs.remove(long_index(bytes));
        }
    }

    /// The finished entry of slot `s` (its outcome read from the side table if it is there).
    fn finished_entry(&self, s: &FinishedSlot) -> Finished {
        let outcome = match s.wide_index() {
            Some(i) => {
                let bytes = self.wide.get(i);
                let num = |at: usize| {
                    bytes
                        .get(at..at.saturating_add(8))
                        .and_then(|b| <[u8; 8]>::try_from(b).ok())
                        .map_or(0, i64::from_le_bytes)
                };
                Outcome::Expired {
                    amount: num(0),
                    charged: num(8),
                }
            }
            None => Outcome::unpack(s.kind(), i64_of(s.value)),
        };
        Finished {
            outcome,
            finished_ms: s.finished(),
        }
    }

    /// `(kind, value)` to store `outcome` of `id` in a finished slot, adding it to the side
    /// table if it needs two numbers. `None`: the table is full (2^32 entries).
    fn encode_outcome(&mut self, outcome: Outcome, id: &[u8]) -> Option<(u8, i64)> {
        if let Some(packed) = outcome.pack() {
            return Some(packed);
        }
        let Outcome::Expired { amount, charged } = outcome else {
            return None;
        };
        let mut bytes = Vec::with_capacity(id.len().saturating_add(16));
        bytes.extend_from_slice(&amount.to_le_bytes());
        bytes.extend_from_slice(&charged.to_le_bytes());
        bytes.extend_from_slice(id);
        let index = self.wide.add(&bytes)?;
        Some((KIND_EXPIRED_PART, i64::from(index)))
    }

    /// Drops the side-table entry a finished slot names, if any.
    fn release_outcome(&mut self, slot: &FinishedSlot) {
        if let Some(i) = slot.wide_index() {
            self.wide.remove(i);
        }
    }
}

/// What the deadline index sums below each node: the amount, number and elapsed charge of
/// the pending reservations there, so that those whose deadline has passed are summed in
/// O(log n) ([`Book::expired`]). Wrapping arithmetic: exact whenever the true sum fits an
/// i64, as any sum of pending amounts does (they sum to `reserved`; an elapsed charge is at
/// most its amount), and it never panics on loaded data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingSum {
    /// Units reserved.
    pub amount: i64,
    /// Reservations.
    pub count: u64,
    /// What `ONEXPIRE ELAPSED` would charge them ([`Reservation::elapsed_charge`] with the
    /// unit of [`Book::set_unit`]).
    pub elapsed: i64,
}

impl Measure for PendingSum {
    fn plus(self, other: Self) -> Self {
        PendingSum {
            amount: self.amount.wrapping_add(other.amount),
            count: self.count.wrapping_add(other.count),
            elapsed: self.elapsed.wrapping_add(other.elapsed),
        }
    }
    fn minus(self, other: Self) -> Self {
        PendingSum {
            amount: self.amount.wrapping_sub(other.amount),
            count: self.count.wrapping_sub(other.count),
            elapsed: self.elapsed.wrapping_sub(other.elapsed),
        }
    }
}

/// The deadline index's measure of handle `h`, read from its slot.
fn pending_measure(store: &Store) -> impl Fn(u32) -> PendingSum + '_ {
    move |h| {
        store
            .pending_slot(h)
            .map_or(PendingSum::default(), |s| PendingSum {
                amount: i64_of(s.amount),
                count: 1,
                elapsed: s.reservation().elapsed_charge(store.unit_ms),
            })
    }
}

/// The deadline index: pending handles by (deadline, id), summing their amounts.
type DeadlineIndex = HTree<PendingSum>;

/// Appends a pending slot and indexes it by deadline (the caller indexes it by id).
fn add_pending(
    store: &mut Store,
    by_deadline: &mut DeadlineIndex,
    deadline_bound: &mut Option<i64>,
    id: [u8; INLINE],
    meta: u8,
    r: Reservation,
    id_above: bool,
) -> Option<u32> {
    let slot = PendingSlot {
        id,
        meta: meta & LEN_MASK,
        amount: r.amount.to_le_bytes(),
        created: r.created_ms.to_le_bytes(),
        deadline: r.deadline_ms.to_le_bytes(),
        heartbeat: r.heartbeat_ms.to_le_bytes(),
    };
    let h = store.pending.push(slot)?;
    index_deadline(store, by_deadline, deadline_bound, h, id_above);
    Some(h)
}

/// Appends a finished slot and indexes it by finish time (the caller indexes it by id).
fn add_finished(
    store: &mut Store,
    by_finish: &mut HTree,
    id: [u8; INLINE],
    meta: u8,
    f: Finished,
) -> Option<u32> {
    let id_bytes = store.id(&id, meta).to_vec();
    let (kind, value) = store.encode_outcome(f.outcome, &id_bytes)?;
    let slot = FinishedSlot {
        id,
        meta: (meta & LEN_MASK) | (kind << KIND_SHIFT),
        value: value.to_le_bytes(),
        finished: f.finished_ms.to_le_bytes(),
    };
    let Some(h) = store.finished.push(slot) else {
        store.release_outcome(&slot);
        return None;
    };
    let store = &*store;
    let key = store.finished_key(h);
    by_finish.insert(h, |x| key.cmp(&store.finished_key(x)));
    Some(h)
}

/// A pending reservation's new values, in place (re-indexed if the deadline, or what the
/// index sums — the amount, the elapsed charge — changed).
fn update_pending(
    store: &mut Store,
    by_deadline: &mut DeadlineIndex,
    deadline_bound: &mut Option<i64>,
    h: u32,
    r: Reservation,
) {
    let Some(old) = store.pending_slot(h) else {
        return;
    };
    let old = old.reservation();
    let moved = old.deadline_ms != r.deadline_ms
        || old.amount != r.amount
        || old.created_ms != r.created_ms
        || old.heartbeat_ms != r.heartbeat_ms;
    if moved {
        let store = &*store;
        let key = store.pending_key(h);
        by_deadline.remove_measured(|x| key.cmp(&store.pending_key(x)), &pending_measure(store));
    }
    if let Some(slot) = store.pending.get_mut(h) {
        slot.amount = r.amount.to_le_bytes();
        slot.created = r.created_ms.to_le_bytes();
        slot.deadline = r.deadline_ms.to_le_bytes();
        slot.heartbeat = r.heartbeat_ms.to_le_bytes();
    }
    if moved {
        index_deadline(store, by_deadline, deadline_bound, h, false);
    }
}

/// A finished id's new outcome, in place (re-indexed if the finish time moved).
fn update_finished(store: &mut Store, by_finish: &mut HTree, h: u32, f: Finished) {
    let Some(&old) = store.finished_slot(h) else {
        return;
    };
    let id_bytes = store.id(&old.id, old.meta).to_vec();
    let Some((kind, value)) = store.encode_outcome(f.outcome, &id_bytes) else {
        return;
    };
    store.release_outcome(&old);
    let moved = old.finished() != f.finished_ms;
    if moved {
        let store = &*store;
        let key = store.finished_key(h);
        by_finish.remove(|x| key.cmp(&store.finished_key(x)));
    }
    if let Some(slot) = store.finished.get_mut(h) {
        slot.meta = (slot.meta & LEN_MASK) | (kind << KIND_SHIFT);
        slot.value = value.to_le_bytes();
        slot.finished = f.finished_ms.to_le_bytes();
    }
    if moved {
        let store = &*store;
        let key = store.finished_key(h);
        by_finish.insert(h, |x| key.cmp(&store.finished_key(x)));
    }
}

/// The soonest deadline, read from the deadline index (what [`Soonest`] caches).
fn indexed_first_deadline(by_deadline: &DeadlineIndex, store: &Store) -> Option<i64> {
    store
        .pending_slot(by_deadline.first()?)
        .map(PendingSlot::deadline)
}

/// The earliest finish time, read from the finish index (what [`Soonest`] caches).
fn indexed_first_finish(by_finish: &HTree, store: &Store) -> Option<i64> {
    store
        .finished_slot(by_finish.first()?)
        .map(FinishedSlot::finished)
}

/// Removes handle `h` from a time index. The soonest entry (what expiry and forgetting take)
/// is found without comparing keys: it is the leftmost, below every other.
fn remove_handle<M: Measure>(
    tree: &mut HTree<M>,
    h: u32,
    probe: impl Fn(u32) -> Ordering,
    measure: &impl Fn(u32) -> M,
) {
    if tree.first() == Some(h) {
        tree.remove_measured(
            |x| {
                if x == h {
                    Ordering::Equal
                } else {
                    Ordering::Less
                }
            },
            measure,
        );
    } else {
        tree.remove_measured(probe, measure);
    }
}

/// The compaction steps that follow a removal from the slab `slab_of(store)`:
/// `repoint(store, from, to)` points the index entries of the entry at `from` at `to`, before
/// the entry moves there.
fn compact_after_removal<T: Slot, const CHUNK: usize>(
    store: &mut Store,
    slab_of: fn(&mut Store) -> &mut Slab<T, CHUNK>,
    mut repoint: impl FnMut(&Store, u32, u32),
) {
    for _ in 0..2 {
        match slab_of(store).compaction_step() {
            None => break,
            Some(Step::Trimmed) => {}
            Some(Step::Move { from, to }) => {
                repoint(store, from, to);
                slab_of(store).finish_move(from, to);
            }
        }
    }
}

/// Takes pending slot `h` out of the slab and the deadline index. The pending-id index must
/// no longer hold `h` for this entry; the long-id store is the caller's.
fn take_pending(
    store: &mut Store,
    by_deadline: &mut DeadlineIndex,
    pending_ids: &mut HTree,
    h: u32,
) -> Option<PendingSlot> {
    {
        let store = &*store;
        remove_handle(
            by_deadline,
            h,
            |x| store.pending_key(h).cmp(&store.pending_key(x)),
            &pending_measure(store),
        );
    }
    let removed = store.pending.remove(h);
    compact_after_removal(
        store,
        |s| &mut s.pending,
        |st, from, to| {
            let moved = st.pending_key(from);
            by_deadline.replace(|x| moved.cmp(&st.pending_key(x)), to);
            pending_ids.replace(|x| moved.1.cmp(st.pending_id(x)), to);
        },
    );
    removed
}

/// Mirror of [`take_pending`] for finished slot `h`.
fn take_finished(
    store: &mut Store,
    by_finish: &mut HTree,
    finished_ids: &mut HTree,
    h: u32,
) -> Option<FinishedSlot> {
    {
        let store = &*store;
        remove_handle(
            by_finish,
            h,
            |x| store.finished_key(h).cmp(&store.finished_key(x)),
            &|_| (),
        );
    }
    let removed = store.finished.remove(h);
    compact_after_removal(
        store,
        |s| &mut s.finished,
        |st, from, to| {
            let moved = st.finished_key(from);
            by_finish.replace(|x| moved.cmp(&st.finished_key(x)), to);
            finished_ids.replace(|x| moved.1.cmp(st.finished_id(x)), to);
        },
    );
    removed
}

/// Pending reservations and finished ids of one key.
#[derive(Clone, Default)]
pub struct Book {
    store: Store,
    /// Pending handles by id.
    pending_ids: HTree,
    /// Finished handles by id. Apart from the pending ones so that the ids a client settles
    /// (pending, usually few) are found without searching the many remembered ids, and so that
    /// a settled generated id (above every remembered one) is appended, not searched for.
    finished_ids: HTree,
    /// Pending handles by (deadline, id), with their amounts summed.
    by_deadline: DeadlineIndex,
    /// Finished handles by (finished_ms, id).
    by_finish: HTree,
    /// The soonest deadline and the earliest finish time (the first keys of the two time
    /// indexes), read by every command's view and maintenance: kept here so that reading them
    /// does not walk down to a cold corner of a large book on each call.
    soonest: Soonest,
    /// Upper bounds of the ids and of the deadlines indexed: what is known to be above every
    /// key without reading the last one.
    bounds: Bounds,
}

/// Most id bytes an [`IdBound`] holds: a generated id (`<ms>-<seq>`, 15 to 20 bytes) fits.
const BOUND_LEN: usize = 23;

/// An upper bound (byte order) of every id indexed in a book since it was created, never
/// lowered by removals. An id above it is above every id of both id indexes: a generated id
/// (above the ones before it) is known absent, and appended, without walking down to the
/// indexes' last entries — cold corners of a large book, most of the cache misses of a
/// multi-key grant (issue 19). A key that has indexed an id above the generated ones (one
/// starting with a letter, such as `req-42`) or longer than [`BOUND_LEN`] loses the shortcut
/// until it is loaded again: its lookups then walk the indexes, as they all did before.
#[derive(Clone, Copy)]
struct IdBound {
    /// 0: no id indexed yet (every id is above); [`IdBound::UNKNOWN`]: an id longer than
    /// [`BOUND_LEN`] was indexed (none is known above); else the bound's length.
    len: u8,
    bytes: [u8; BOUND_LEN],
}

impl IdBound {
    const UNKNOWN: u8 = u8::MAX;

    /// Is `id` above every id indexed?
    fn is_below(&self, id: &[u8]) -> bool {
        match self.len {
            0 => true,
            Self::UNKNOWN => false,
            n => self
                .bytes
                .get(..usize::from(n))
                .is_some_and(|bound| id > bound),
        }
    }

    /// Keeps the bound above `id`, about to be indexed.
    fn raise(&mut self, id: &[u8]) {
        if self.len == Self::UNKNOWN || !self.is_below(id) {
            return;
        }
        match (u8::try_from(id.len()), self.bytes.get_mut(..id.len())) {
            (Ok(n), Some(bytes)) => {
                bytes.copy_from_slice(id);
                self.len = n;
            }
            _ => self.len = Self::UNKNOWN,
        }
    }
}

impl Default for IdBound {
    fn default() -> Self {
        IdBound {
            len: 0,
            bytes: [0; BOUND_LEN],
        }
    }
}

/// See [`Book::bounds`].
#[derive(Clone, Copy, Default)]
struct Bounds {
    id: IdBound,
    /// At or above every deadline indexed since the book was created (`None`: none was); a
    /// later deadline is appended to the deadline index without reading its last key.
    deadline: Option<i64>,
}

/// Indexes pending handle `h` (its slot filled) by deadline: appended without a comparison
/// when its key (deadline, id) is known to be above every one indexed before: its deadline is
/// later than `bound` (raised here), or equal to it and its id above every id the book has
/// indexed (`id_above`, from [`IdBound::is_below`] before the id was indexed). The second case
/// is a busy key's: several grants within one millisecond share a deadline, and were searched
/// for through the slots, one cold line per comparison.
fn index_deadline(
    store: &Store,
    by_deadline: &mut DeadlineIndex,
    bound: &mut Option<i64>,
    h: u32,
    id_above: bool,
) {
    let key = store.pending_key(h);
    let above = bound.is_none_or(|b| key.0 > b || (key.0 == b && id_above));
    by_deadline.insert_measured_above(
        h,
        |x| key.cmp(&store.pending_key(x)),
        &pending_measure(store),
        above,
    );
    *bound = Some(bound.map_or(key.0, |b| b.max(key.0)));
}

/// The first keys of the time indexes, kept in step by every change.
#[derive(Clone, Copy, Default)]
struct Soonest {
    deadline: Option<i64>,
    finish: Option<i64>,
}

/// The earlier of a known soonest time and a time just added.
fn earlier(known: Option<i64>, added: i64) -> Option<i64> {
    Some(known.map_or(added, |k| k.min(added)))
}

impl Book {
    /// Number of pending reservations (expired-but-unreleased ones included).
    pub fn pending_len(&self) -> usize {
        self.by_deadline.len()
    }

    /// Number of remembered finished ids.
    pub fn finished_len(&self) -> usize {
        self.by_finish.len()
    }

    /// The entry of `id`, pending or remembered. An id above all (a new client id that grows,
    /// such as a time-ordered request id) is answered with one comparison per index.
    pub fn get(&self, id: &[u8]) -> Option<Entry> {
        if self.bounds.id.is_below(id) {
            return None;
        }
        let store = &self.store;
        let in_pending = |h| id.cmp(store.pending_id(h));
        if !self.pending_ids.is_above_last(in_pending) {
            if let Some(h) = self.pending_ids.find(in_pending) {
                return store
                    .pending_slot(h)
                    .map(|s| Entry::Pending(s.reservation()));
            }
        }
        let in_finished = |h| id.cmp(store.finished_id(h));
        if self.finished_ids.is_above_last(in_finished) {
            return None;
        }
        let h = self.finished_ids.find(in_finished)?;
        store
            .finished_slot(h)
            .map(|s| Entry::Finished(store.finished_entry(s)))
    }

    /// Is `id` known (pending or remembered)? An id above all (generated, or a growing client
    /// id) is answered with one comparison per index.
    fn contains(&self, id: &[u8]) -> bool {
        if self.bounds.id.is_below(id) {
            return false;
        }
        let store = &self.store;
        let in_pending = |h| id.cmp(store.pending_id(h));
        let in_finished = |h| id.cmp(store.finished_id(h));
        (!self.pending_ids.is_above_last(in_pending) && self.pending_ids.find(in_pending).is_some())
            || (!self.finished_ids.is_above_last(in_finished)
                && self.finished_ids.find(in_finished).is_some())
    }

    /// The memory a grant is about to touch below the book itself: the roots of the pending
    /// id and deadline indexes and the pending slab's last chunk. See
    /// [`crate::core::ledger::Budget::hot_addresses`].
    pub fn hot_addresses(&self, out: &mut impl FnMut(*const u8, usize)) {
        self.pending_ids.root_addresses(out);
        self.by_deadline.root_addresses(out);
        // Where a grant's slot goes (written, then read back by the deadline index).
        if let Some(next) = self.store.pending.next_address() {
            out(next, std::mem::size_of::<PendingSlot>());
        }
    }

    /// Pending reservations, soonest deadline first, as `(deadline_ms, id)`.
    pub fn by_deadline(&self) -> impl Iterator<Item = (i64, &[u8])> + '_ {
        let store = &self.store;
        self.by_deadline.iter().map(|h| store.pending_key(h))
    }

    /// The total amount and the number of pending reservations whose deadline is at or before
    /// `now_ms` (expired, not yet released). O(log n): one descent of the deadline index.
    pub fn expired(&self, now_ms: i64) -> PendingSum {
        let store = &self.store;
        self.by_deadline.sum_below(
            |h| match store.pending_slot(h) {
                Some(s) if s.deadline() <= now_ms => Ordering::Greater,
                _ => Ordering::Less,
            },
            &pending_measure(store),
        )
    }

    /// Sets the unit (ms; `None` or <= 0: none) with which [`PendingSum::elapsed`] is summed.
    /// A change re-sums the deadline index: O(n log n) in the pending reservations, paid only
    /// by a QUOTA.SET that changes UNIT.
    pub fn set_unit(&mut self, unit_ms: Option<i64>) {
        let unit_ms = unit_ms.unwrap_or(0).max(0);
        if unit_ms == self.store.unit_ms {
            return;
        }
        self.store.unit_ms = unit_ms;
        let handles: Vec<u32> = self.by_deadline.iter().collect();
        let mut tree = DeadlineIndex::default();
        let mut bound = None;
        for h in handles {
            index_deadline(&self.store, &mut tree, &mut bound, h, false);
        }
        self.by_deadline = tree;
        self.bounds.deadline = bound;
    }

    /// The soonest deadline of a pending reservation.
    pub fn first_deadline(&self) -> Option<i64> {
        self.soonest.deadline
    }

    /// The earliest finish time of a remembered id.
    pub fn first_finish(&self) -> Option<i64> {
        self.soonest.finish
    }

    /// Pending reservations with `deadline > after_ms`, soonest first.
    pub fn live_after(&self, after_ms: i64) -> impl Iterator<Item = (&[u8], Reservation)> + '_ {
        let store = &self.store;
        self.by_deadline
            .iter_from(move |h| {
                if after_ms < store.pending_key(h).0 {
                    Ordering::Less
                } else {
                    Ordering::Greater
                }
            })
            .filter_map(|h| {
                store
                    .pending_slot(h)
                    .map(|s| (store.pending_id(h), s.reservation()))
            })
    }

    /// Finished ids, earliest finish first, as `(finished_ms, id)`.
    pub fn by_finish(&self) -> impl Iterator<Item = (i64, &[u8])> + '_ {
        let store = &self.store;
        self.by_finish.iter().map(|h| store.finished_key(h))
    }

    /// All entries in id order (for persistence and digests).
    pub fn entries(&self) -> impl Iterator<Item = (&[u8], Entry)> + '_ {
        let store = &self.store;
        let mut pending = self
            .pending_ids
            .iter()
            .filter_map(|h| {
                store
                    .pending_slot(h)
                    .map(|s| (store.pending_id(h), Entry::Pending(s.reservation())))
            })
            .peekable();
        let mut finished = self
            .finished_ids
            .iter()
            .filter_map(|h| {
                store.finished_slot(h).map(|s| {
                    (
                        store.finished_id(h),
                        Entry::Finished(store.finished_entry(s)),
                    )
                })
            })
            .peekable();
        // A merge of the two id orders (an id is in one of them only).
        std::iter::from_fn(move || match (pending.peek(), finished.peek()) {
            (Some(p), Some(f)) if f.0 < p.0 => finished.next(),
            (Some(_), _) => pending.next(),
            (None, _) => finished.next(),
        })
    }

    /// Inserts or replaces an entry, keeping the indexes in step. A replacement of the same
    /// kind is made in place; a pending reservation that finishes moves to the finished slab
    /// with one search of the id index.
    pub fn put(&mut self, id: &[u8], entry: Entry) {
        let found = self.update(id, |_| Ok::<Entry, ()>(entry), ());
        if found.is_err() {
            self.insert(id, entry);
        }
    }

    /// Replaces the entry of a known id by what `f` makes of it, with one search of the id
    /// index. `Err(missing)` if the id is unknown, `f`'s error if it refuses; nothing changed
    /// then.
    pub fn update<E>(
        &mut self,
        id: &[u8],
        f: impl FnOnce(Entry) -> Result<Entry, E>,
        missing: E,
    ) -> Result<(), E> {
        let Book {
            store,
            pending_ids,
            finished_ids,
            by_deadline,
            by_finish,
            soonest,
            bounds,
        } = self;
        // One search of the id's index decides and, when the entry changes kind, takes the id
        // out of it. The pending ids first: fewer, and what settles and rollbacks look for.
        let mut f = Some(f);
        let mut made: Option<Result<(Entry, Entry), E>> = None;
        let mut decide = |current: Option<Entry>| -> bool {
            let (Some(current), Some(f)) = (current, f.take()) else {
                return false;
            };
            let result = f(current).map(|entry| (current, entry));
            let moves = matches!(
                (current, &result),
                (Entry::Pending(_), Ok((_, Entry::Finished(_))))
                    | (Entry::Finished(_), Ok((_, Entry::Pending(_))))
            );
            made = Some(result);
            moves
        };
        let st = &*store;
        let (is_pending, found) = match pending_ids.remove_if(
            |h| id.cmp(st.pending_id(h)),
            |h| decide(st.pending_slot(h).map(|s| Entry::Pending(s.reservation()))),
        ) {
            Found::Absent => (
                false,
                finished_ids.remove_if(
                    |h| id.cmp(st.finished_id(h)),
                    |h| {
                        decide(
                            st.finished_slot(h)
                                .map(|s| Entry::Finished(st.finished_entry(s))),
                        )
                    },
                ),
            ),
            other => (true, other),
        };
        let (old, moved_out) = match found {
            Found::Removed(h) => (h, true),
            Found::Kept(h) => (h, false),
            Found::Absent => return Err(missing),
        };
        let (current, entry) = match made {
            Some(Ok(pair)) => pair,
            Some(Err(e)) => return Err(e),
            None => return Err(missing),
        };
        match (is_pending, entry) {
            (true, Entry::Pending(r)) => {
                update_pending(store, by_deadline, &mut bounds.deadline, old, r);
            }
            (false, Entry::Finished(f)) => update_finished(store, by_finish, old, f),
            (true, Entry::Finished(f)) if moved_out => {
                // The new slot exists before anything compares its handle.
                let Some(&s) = store.pending_slot(old) else {
                    return Err(missing);
                };
                let Some(h) = add_finished(store, by_finish, s.id, s.meta, f) else {
                    // Out of handles (2^31 entries): put the id back, nothing changed.
                    let st = &*store;
                    pending_ids.insert(old, |x| id.cmp(st.pending_id(x)));
                    return Err(missing);
                };
                let st = &*store;
                finished_ids.insert(h, |x| id.cmp(st.finished_id(x)));
                take_pending(store, by_deadline, pending_ids, old);
            }
            (false, Entry::Pending(r)) if moved_out => {
                let Some(&s) = store.finished_slot(old) else {
                    return Err(missing);
                };
                let Some(h) = add_pending(
                    store,
                    by_deadline,
                    &mut bounds.deadline,
                    s.id,
                    s.meta,
                    r,
                    false,
                ) else {
                    let st = &*store;
                    finished_ids.insert(old, |x| id.cmp(st.finished_id(x)));
                    return Err(missing);
                };
                let st = &*store;
                pending_ids.insert(h, |x| id.cmp(st.pending_id(x)));
                if let Some(slot) = take_finished(store, by_finish, finished_ids, old) {
                    store.release_outcome(&slot);
                }
            }
            _ => return Err(missing),
        }
        // Only a change at the front of a time index moves what is cached: a settle of a
        // recent reservation (the usual case) leaves the soonest deadline where it was.
        match (current, entry) {
            (Entry::Pending(a), Entry::Pending(b)) => {
                if soonest.deadline == Some(a.deadline_ms) || b.deadline_ms < a.deadline_ms {
                    soonest.deadline = indexed_first_deadline(by_deadline, store);
                }
            }
            (Entry::Finished(a), Entry::Finished(b)) => {
                if soonest.finish == Some(a.finished_ms) || b.finished_ms < a.finished_ms {
                    soonest.finish = indexed_first_finish(by_finish, store);
                }
            }
            (Entry::Pending(a), Entry::Finished(b)) => {
                if soonest.deadline == Some(a.deadline_ms) {
                    soonest.deadline = indexed_first_deadline(by_deadline, store);
                }
                soonest.finish = earlier(soonest.finish, b.finished_ms);
            }
            (Entry::Finished(a), Entry::Pending(b)) => {
                if soonest.finish == Some(a.finished_ms) {
                    soonest.finish = indexed_first_finish(by_finish, store);
                }
                soonest.deadline = earlier(soonest.deadline, b.deadline_ms);
            }
        }
        // An outcome replaced or moved out may have left a hole in the side table.
        if matches!(current, Entry::Finished(_)) {
            self.compact_wide();
        }
        Ok(())
    }

    /// Inserts a new id; false (and nothing changed) if the id is already present.
    pub fn insert(&mut self, id: &[u8], entry: Entry) -> bool {
        let handle = match entry {
            Entry::Pending(_) => self.store.pending.next_handle(),
            Entry::Finished(_) => self.store.finished.next_handle(),
        };
        let above = self.bounds.id.is_below(id);
        let (Some(handle), false) = (handle, !above && self.contains(id)) else {
            return false;
        };
        let Some((bytes, meta)) = self.store.encode_id(id) else {
            return false;
        };
        // The slot exists before its handle is indexed (the indexes compare through slots).
        match entry {
            Entry::Pending(r) => {
                add_pending(
                    &mut self.store,
                    &mut self.by_deadline,
                    &mut self.bounds.deadline,
                    bytes,
                    meta,
                    r,
                    above,
                );
                let store = &self.store;
                self.pending_ids
                    .insert_above(handle, |h| id.cmp(store.pending_id(h)), above);
                self.soonest.deadline = earlier(self.soonest.deadline, r.deadline_ms);
            }
            Entry::Finished(f) => {
                add_finished(&mut self.store, &mut self.by_finish, bytes, meta, f);
                let store = &self.store;
                self.finished_ids
                    .insert_above(handle, |h| id.cmp(store.finished_id(h)), above);
                self.soonest.finish = earlier(self.soonest.finish, f.finished_ms);
            }
        }
        self.bounds.id.raise(id);
        true
    }

    /// Removes an id, returning its entry.
    pub fn remove(&mut self, id: &[u8]) -> Option<Entry> {
        let store = &self.store;
        if let Some(h) = self.pending_ids.remove(|h| id.cmp(store.pending_id(h))) {
            let entry = store
                .pending_slot(h)
                .map(|s| Entry::Pending(s.reservation()));
            if let Some(slot) = take_pending(
                &mut self.store,
                &mut self.by_deadline,
                &mut self.pending_ids,
                h,
            ) {
                self.store.release_id(&slot.id, slot.meta);
            }
            self.soonest.deadline = indexed_first_deadline(&self.by_deadline, &self.store);
            self.compact_long_ids();
            return entry;
        }
        let h = self.finished_ids.remove(|h| id.cmp(store.finished_id(h)))?;
        let entry = store
            .finished_slot(h)
            .map(|s| Entry::Finished(store.finished_entry(s)));
        if let Some(slot) = take_finished(
            &mut self.store,
            &mut self.by_finish,
            &mut self.finished_ids,
            h,
        ) {
            self.store.release_id(&slot.id, slot.meta);
            self.store.release_outcome(&slot);
        }
        self.soonest.finish = indexed_first_finish(&self.by_finish, &self.store);
        self.compact_long_ids();
        self.compact_wide();
        entry
    }

    /// Up to two moves of the side table's tail entry into its lowest hole (as
    /// [`Book::compact_long_ids`]): the finished slot naming it is found by its id.
    fn compact_wide(&mut self) {
        for _ in 0..2 {
            let Some((from, to)) = self.store.wide.next_move() else {
                return;
            };
            let id: Vec<u8> = self.store.wide.get(from).get(16..).unwrap_or(&[]).to_vec();
            let store = &self.store;
            let Some(h) = self
                .finished_ids
                .find(|h| id.as_slice().cmp(store.finished_id(h)))
            else {
                return;
            };
            let names_it = store.finished_slot(h).and_then(FinishedSlot::wide_index) == Some(from);
            if !names_it || !self.store.wide.relocate(from, to) {
                return;
            }
            if let Some(slot) = self.store.finished.get_mut(h) {
                slot.value = i64::from(to).to_le_bytes();
            }
        }
    }

    /// Up to two moves of [`LongIds::next_move`]: the long id at the table's tail goes to its
    /// lowest hole, and the slot naming it is found by one search of the id indexes and told
    /// the new index (the id, so every order, is unchanged).
    fn compact_long_ids(&mut self) {
        for _ in 0..2 {
            let Some((from, to)) = self.store.longs.next_move() else {
                return;
            };
            let id: Vec<u8> = self.store.longs.get(from).to_vec();
            let store = &self.store;
            let at = match self
                .pending_ids
                .find(|h| id.as_slice().cmp(store.pending_id(h)))
            {
                Some(h) => Some((true, h)),
                None => self
                    .finished_ids
                    .find(|h| id.as_slice().cmp(store.finished_id(h)))
                    .map(|h| (false, h)),
            };
            let Some((pending, h)) = at else {
                return;
            };
            let names_it = self
                .store
                .slot_id_mut(pending, h)
                .is_some_and(|(bytes, meta)| meta & LEN_MASK == LONG && long_index(bytes) == from);
            if !names_it || !self.store.longs.relocate(from, to) {
                return;
            }
            if let Some((bytes, _)) = self.store.slot_id_mut(pending, h) {
                set_long_index(bytes, to);
            }
        }
    }

    /// Calls `f(requested bytes, count)` for every heap allocation the book holds, so that
    /// MEMORY USAGE can round each to the allocator's size classes.
    pub fn allocations(&self, mut f: impl FnMut(usize, usize)) {
        self.store.pending.allocations(&mut f);
        self.store.finished.allocations(&mut f);
        self.store.longs.allocations(&mut f);
        self.store.wide.allocations(&mut f);
        for tree in [&self.pending_ids, &self.finished_ids, &self.by_finish] {
            tree.allocations(&mut f);
        }
        self.by_deadline.allocations(&mut f);
    }

    /// Requested heap bytes (before allocator rounding).
    pub fn heap_bytes(&self) -> usize {
        let mut total = 0usize;
        self.allocations(|bytes, count| {
            total = total.saturating_add(bytes.saturating_mul(count));
        });
        total
    }

    /// Checks the indexes against the slabs; for tests.
    pub fn check(&self) -> Result<(), &'static str> {
        let store = &self.store;
        self.pending_ids
            .check(|a, b| store.pending_id(a).cmp(store.pending_id(b)))?;
        self.finished_ids
            .check(|a, b| store.finished_id(a).cmp(store.finished_id(b)))?;
        // Each id in one index only: the merged order is strict.
        let ids: Vec<&[u8]> = self.entries().map(|(id, _)| id).collect();
        if ids.windows(2).any(|w| matches!(w, [a, b] if a >= b)) {
            return Err("an id is both pending and finished");
        }
        self.by_deadline
            .check(|a, b| store.pending_key(a).cmp(&store.pending_key(b)))?;
        self.by_deadline.check_sums(&pending_measure(store))?;
        self.by_finish
            .check(|a, b| store.finished_key(a).cmp(&store.finished_key(b)))?;
        store.pending.check()?;
        store.finished.check()?;
        let mut wide = 0usize;
        for h in self.finished_ids.iter() {
            if let Some(i) = store.finished_slot(h).and_then(FinishedSlot::wide_index) {
                wide = wide.saturating_add(1);
                if store.wide.get(i).get(16..) != Some(store.finished_id(h)) {
                    return Err("a side-table entry names another id");
                }
            }
        }
        if wide != store.wide.live {
            return Err("side-table entries and the slots naming them differ");
        }
        if self.by_deadline.len() != store.pending.live()
            || self.by_finish.len() != store.finished.live()
            || self.pending_ids.len() != store.pending.live()
            || self.finished_ids.len() != store.finished.live()
        {
            return Err("index and slab sizes differ");
        }
        if self.entries().any(|(id, _)| self.bounds.id.is_below(id))
            || self
                .by_deadline()
                .any(|(d, _)| self.bounds.deadline.is_none_or(|b| d > b))
        {
            return Err("an id or a deadline is above its bound");
        }
        if self.soonest.deadline != indexed_first_deadline(&self.by_deadline, store)
            || self.soonest.finish != indexed_first_finish(&self.by_finish, store)
        {
            return Err("cached soonest times differ from the indexes");
        }
        Ok(())
    }
}

/// Equal when they hold the same entries (however the slabs are laid out).
impl PartialEq for Book {
    fn eq(&self, other: &Self) -> bool {
        self.pending_ids.len() == other.pending_ids.len()
            && self.finished_ids.len() == other.finished_ids.len()
            && self.entries().eq(other.entries())
    }
}

impl Eq for Book {}

impl fmt::Debug for Book {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.entries()
                    .map(|(id, e)| (String::from_utf8_lossy(id), e)),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn pending(amount: i64, created_ms: i64, deadline_ms: i64) -> Entry {
        Entry::Pending(Reservation::new(amount, created_ms, deadline_ms))
    }

    fn finished(kind: u8, value: i64, at: i64) -> Entry {
        Entry::Finished(Finished {
            // Expiries charging nothing, all or part (the side table) of the amount.
            outcome: match kind % 7 {
                5 => Outcome::Expired {
                    amount: value,
                    charged: value,
                },
                6 => Outcome::Expired {
                    amount: value,
                    charged: value / 2,
                },
                k => Outcome::unpack(k % 5, value),
            },
            finished_ms: at,
        })
    }

    #[test]
    fn slots_are_packed() {
        assert_eq!(std::mem::size_of::<PendingSlot>(), 49);
        assert_eq!(std::mem::size_of::<FinishedSlot>(), 33);
        assert_eq!(crate::core::htree::LEAF_BYTES, 128);
    }

    #[test]
    fn outcomes_round_trip() {
        for o in [
            Outcome::Settled {
                actual: -3,
                late: false,
            },
            Outcome::Settled {
                actual: i64::MAX,
                late: true,
            },
            Outcome::RolledBack { amount: 7 },
            Outcome::Expired {
                amount: 0,
                charged: 0,
            },
            Outcome::Expired {
                amount: 9,
                charged: 4,
            },
            Outcome::Charged { amount: i64::MIN },
        ] {
            match o.pack() {
                Some((k, v)) => assert_eq!(Outcome::unpack(k, v), o),
                None => assert_eq!(
                    o,
                    Outcome::Expired {
                        amount: 9,
                        charged: 4
                    }
                ),
            }
        }
    }

    /// Reference: the former layout.
    #[derive(Default)]
    struct Model {
        entries: BTreeMap<Vec<u8>, Entry>,
        /// The unit the elapsed charges are summed with.
        unit_ms: i64,
    }

    impl Model {
        fn by_deadline(&self) -> Vec<(i64, Vec<u8>)> {
            let mut v: Vec<(i64, Vec<u8>)> = self
                .entries
                .iter()
                .filter_map(|(id, e)| match e {
                    Entry::Pending(r) => Some((r.deadline_ms, id.clone())),
                    _ => None,
                })
                .collect();
            v.sort();
            v
        }

        fn by_finish(&self) -> Vec<(i64, Vec<u8>)> {
            let mut v: Vec<(i64, Vec<u8>)> = self
                .entries
                .iter()
                .filter_map(|(id, e)| match e {
                    Entry::Finished(f) => Some((f.finished_ms, id.clone())),
                    _ => None,
                })
                .collect();
            v.sort();
            v
        }
    }

    fn same(book: &Book, model: &Model) {
        book.check().unwrap();
        let got: Vec<(Vec<u8>, Entry)> = book.entries().map(|(i, e)| (i.to_vec(), e)).collect();
        let want: Vec<(Vec<u8>, Entry)> =
            model.entries.iter().map(|(i, e)| (i.clone(), *e)).collect();
        assert_eq!(got, want);
        let got: Vec<(i64, Vec<u8>)> = book.by_deadline().map(|(d, i)| (d, i.to_vec())).collect();
        assert_eq!(got, model.by_deadline());
        let got: Vec<(i64, Vec<u8>)> = book.by_finish().map(|(d, i)| (d, i.to_vec())).collect();
        assert_eq!(got, model.by_finish());
        assert_eq!(
            book.first_deadline(),
            model.by_deadline().first().map(|x| x.0)
        );
        assert_eq!(book.first_finish(), model.by_finish().first().map(|x| x.0));
        // The expired sums at every deadline held, and either side of it.
        let pending: Vec<(i64, i64, i64)> = model
            .entries
            .values()
            .filter_map(|e| match e {
                Entry::Pending(r) => {
                    Some((r.deadline_ms, r.amount, r.elapsed_charge(model.unit_ms)))
                }
                _ => None,
            })
            .collect();
        let mut times = vec![i64::MIN, i64::MAX];
        let every = (pending.len() / 8).max(1);
        for &(d, _, _) in pending.iter().step_by(every) {
            times.extend([d.saturating_sub(1), d, d.saturating_add(1)]);
        }
        for now in times {
            let expired: Vec<(i64, i64)> = pending
                .iter()
                .filter(|(d, _, _)| *d <= now)
                .map(|(_, a, e)| (*a, *e))
                .collect();
            let want = PendingSum {
                // The book holds any amounts; a ledger's sum to `reserved` and never wrap.
                amount: expired.iter().fold(0i64, |a, b| a.wrapping_add(b.0)),
                count: expired.len() as u64,
                elapsed: expired.iter().fold(0i64, |a, b| a.wrapping_add(b.1)),
            };
            assert_eq!(book.expired(now), want, "at {now}");
        }
        for (id, e) in &model.entries {
            assert_eq!(book.get(id), Some(*e));
        }
        // Absent ids too: above every id (answered without a search), between and below.
        let mut probes: Vec<Vec<u8>> = vec![vec![0xff; 41]];
        for a in 0u8..5 {
            probes.push(vec![a]);
            probes.extend((0u8..5).map(|b| vec![a, b]));
        }
        for id in model.entries.keys() {
            probes.push([id.as_slice(), &[0]].concat());
            probes.push([id.as_slice(), &[0xff]].concat());
        }
        for probe in &probes {
            assert_eq!(book.get(probe), model.entries.get(probe).copied());
        }
        let n = model.entries.len();
        assert_eq!(book.pending_len() + book.finished_len(), n);
    }

    fn id_strategy() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(0u8..4, 1..4),
            proptest::collection::vec(any::<u8>(), 1..40),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        #[test]
        fn matches_the_btreemap_layout(ops in proptest::collection::vec(
            (0u8..6, id_strategy(), -5i64..5, any::<i64>(), 0u8..7), 1..400)) {
            let mut book = Book::default();
            let mut model = Model::default();
            for (op, id, t, v, kind) in ops {
                match op {
                    0 | 1 => {
                        // A heartbeat 0..4 ms after the start.
                        let e = Entry::Pending(Reservation {
                            heartbeat_ms: t.wrapping_sub(1).wrapping_add(i64::from(kind)),
                            ..Reservation::new(v, t.wrapping_sub(1), t)
                        });
                        book.put(&id, e);
                        model.entries.insert(id, e);
                    }
                    2 | 3 => {
                        let e = finished(kind, v, t);
                        book.put(&id, e);
                        model.entries.insert(id, e);
                    }
                    5 => {
                        // A unit of 0 (none) to 4 ms: the elapsed sums are redone.
                        book.set_unit(Some(i64::from(kind)));
                        model.unit_ms = i64::from(kind);
                    }
                    4 if v % 3 == 0 => {
                        let e = if v % 2 == 0 { pending(v, t, t) } else { finished(kind, v, t) };
                        let fresh = !model.entries.contains_key(&id);
                        prop_assert_eq!(book.insert(&id, e), fresh);
                        if fresh {
                            model.entries.insert(id, e);
                        }
                    }
                    _ => {
                        prop_assert_eq!(book.remove(&id), model.entries.remove(&id));
                    }
                }
                // Every intermediate state: the cached soonest times and the split id indexes.
                same(&book, &model);
            }
            for after in -6..6 {
                let got: Vec<Vec<u8>> = book.live_after(after).map(|(i, _)| i.to_vec()).collect();
                let want: Vec<Vec<u8>> = model
                    .by_deadline()
                    .into_iter()
                    .filter(|(d, _)| *d > after)
                    .map(|(_, i)| i)
                    .collect();
                prop_assert_eq!(got, want);
            }
            let copy = book.clone();
            prop_assert_eq!(&copy, &book);
            let ids: Vec<Vec<u8>> = model.entries.keys().cloned().collect();
            for id in ids {
                prop_assert_eq!(book.remove(&id), model.entries.remove(&id));
            }
            same(&book, &model);
            prop_assert_eq!(book.heap_bytes(), 0);
        }
    }

    /// Expiries that charged part of their amount live in the side table: it follows them
    /// (replaced outcomes and removals give entries back, compaction keeps it small).
    #[test]
    fn partial_expiry_charges_keep_their_side_table_small() {
        let part = |i: i64| {
            Entry::Finished(Finished {
                outcome: Outcome::Expired {
                    amount: 10 + i,
                    charged: 3,
                },
                finished_ms: i,
            })
        };
        let id = |i: i64| format!("{i:06}").into_bytes();
        let mut book = Book::default();
        let empty = book.heap_bytes();
        for i in 0..3000 {
            // Pending first, then expired with a partial charge (a move between the slabs).
            assert!(book.insert(&id(i), pending(10 + i, 0, i)));
            book.put(&id(i), part(i));
        }
        book.check().unwrap();
        assert_eq!(book.get(&id(7)), Some(part(7)));
        // A late settle replaces the outcome in place: its side entry is given back.
        for i in (0..3000).step_by(2) {
            book.put(
                &id(i),
                Entry::Finished(Finished {
                    outcome: Outcome::Settled {
                        actual: 1,
                        late: true,
                    },
                    finished_ms: i,
                }),
            );
        }
        book.check().unwrap();
        for i in (1..3000i32).step_by(2).rev().map(i64::from) {
            assert_eq!(book.remove(&id(i)), Some(part(i)));
            if i % 101 == 1 {
                book.check().unwrap();
            }
        }
        assert_eq!(book.store.wide.live, 0);
        for i in (0..3000).step_by(2) {
            assert!(book.remove(&id(i)).is_some());
        }
        assert_eq!(book.heap_bytes(), empty);
    }

    #[test]
    fn long_id_table_gives_back_its_tail() {
        let long = |i: i64| format!("a-long-client-id-{i:024}").into_bytes();
        let mut book = Book::default();
        book.insert(&long(-1), pending(1, 0, 100));
        let one = book.heap_bytes();
        for i in 0..20_000 {
            assert!(book.insert(&long(i), pending(1, 0, 100)));
        }
        // Removed in any order: the table shrinks back once the tail is free.
        for i in (0..20_000).rev().step_by(2).chain((0..20_000).step_by(2)) {
            assert!(book.remove(&long(i)).is_some());
        }
        book.check().unwrap();
        assert_eq!(book.pending_len(), 1);
        // One id left: its bytes, a few slab slots, small trees; the table of 20 000 long ids
        // (16 B a slot, 4 B a free index) and the slab's table of chunks are gone.
        assert!(
            book.heap_bytes() < 2 * 1024,
            "{} vs {one}",
            book.heap_bytes()
        );
        // Nor does a drain leave the slab's table of chunks at its peak size.
        assert!(book.store.pending.chunks.capacity() <= 8);
        // One id left at the table's far end does not pin it either: ids move to the front.
        for i in 0..20_000 {
            assert!(book.insert(&long(100_000 + i), pending(1, 0, 100)));
        }
        for i in 0..19_999 {
            assert!(book.remove(&long(100_000 + i)).is_some());
        }
        book.check().unwrap();
        assert_eq!(book.get(&long(119_999)), Some(pending(1, 0, 100)));
        assert!(
            book.heap_bytes() < 2 * 1024,
            "{} vs {one}",
            book.heap_bytes()
        );
        assert!(book.remove(&long(119_999)).is_some());
        // Holes are reused lowest first, so a key with steady churn stays at its live size.
        for round in 0..50 {
            for i in 0..100 {
                book.insert(&long(round * 1000 + i), pending(1, 0, 100));
            }
            for i in 0..100 {
                book.remove(&long(round * 1000 + i));
            }
        }
        assert!(
            book.heap_bytes() < 2 * 1024,
            "{} vs {one}",
            book.heap_bytes()
        );
        book.check().unwrap();
    }

    #[test]
    fn bulk_settle_keeps_everything_consistent() {
        let mut book = Book::default();
        let mut model = Model::default();
        for i in 0..3000i64 {
            let id = format!("id-{i:013}").into_bytes();
            let e = pending(1, i, 1000 + i % 17);
            book.put(&id, e);
            model.entries.insert(id, e);
        }
        same(&book, &model);
        for i in (0..3000i64).rev().step_by(2) {
            let id = format!("id-{i:013}").into_bytes();
            let e = finished(0, 1, 5000 + i);
            book.put(&id, e);
            model.entries.insert(id, e);
        }
        same(&book, &model);
        assert!(book.live_after(1008).all(|(_, r)| r.deadline_ms > 1008));
        let long = vec![7u8; 100];
        book.put(&long, pending(5, 1, 2));
        model.entries.insert(long.clone(), pending(5, 1, 2));
        same(&book, &model);
        assert_eq!(book.remove(&long), Some(pending(5, 1, 2)));
        model.entries.remove(&long);
        same(&book, &model);
    }

    /// A busy key's grants: many within one millisecond share a deadline. A rising id is
    /// appended to the deadline index by the bounds (the debug build asserts each such claim),
    /// a lower one at the same deadline is searched for; both leave the index in order.
    #[test]
    fn equal_deadlines_append_rising_ids_and_search_the_others() {
        let mut book = Book::default();
        let mut model = Model::default();
        for i in 0..2000i64 {
            // Generated-style ids rising, 50 grants per deadline.
            let id = format!("1700000000{:03}-{}", i / 50, i % 50).into_bytes();
            let e = pending(1, i / 50, 60_000 + i / 50);
            assert_fresh(book.insert(&id, e));
            model.entries.insert(id, e);
            if i % 97 == 0 {
                // An id below the others, at the newest deadline: not above, searched.
                let low = format!("0-{i}").into_bytes();
                let e = pending(2, i / 50, 60_000 + i / 50);
                assert_fresh(book.insert(&low, e));
                model.entries.insert(low, e);
            }
        }
        same(&book, &model);
        assert_eq!(book.expired(60_010).count, 11 * 50 + 6);
    }

    fn assert_fresh(inserted: bool) {
        assert!(inserted, "a fresh id was refused");
    }
}
