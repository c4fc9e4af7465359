//! The reservation ids a configured window key remembers (multi-key admission, issue 19):
//! `id → (bucket index, amount counted, status)`. Storage only: the rules (when an id is
//! alive, what a correction does to the buckets) are [`crate::core::window::Window`]'s.
//!
//! Ids arrive in the order of their bucket (time never goes backwards for a key) and leave it
//! oldest first, so they are kept in one queue in that order — which is also the persisted
//! order — and found by id through a hash table of their positions in the queue
//! (`hashbrown::HashTable<u32>`, SipHash keyed per process: client ids cannot be chosen to
//! collide). Each id is stored once; it is hashed when it is looked up or arrives (the last
//! id hashed is memoised: a multi-key command looks one id up in several keys). The table
//! takes 32 bits of the hash, which an id of at most 19 bytes keeps in its slot's spare inline
//! bytes: forgetting it (every call into a busy window forgets the ids that left) and growing
//! the table hash nothing; a longer id is hashed again when it leaves.
//!
//! Memory: a 40-byte slot per id in the queue — the id inline up to 23 bytes (longer ids: one
//! allocation of their length), the amount counted, and the bucket index with the status in
//! its top two bits (indexes are kept within ±2^61: [`Remembered::holds_index`]) — grown by an
//! eighth at a time and then to fill the allocator's size class, and 5 bytes per slot of the
//! table (at most 7/8 full, grown by doubling): 46 to 68 bytes per id, typically 50 to 55
//! (issue 19 measured 94 with 56-byte slots); see [`Remembered::allocations`]. This is the
//! layout in memory only: the persisted encoding (`src/shell/persist/window.rs`) is
//! independent of it. An empty set owns no heap.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::num::NonZeroU8;

use hashbrown::hash_table::Entry as TableEntry;
use hashbrown::HashTable;

/// Where a remembered id stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdStatus {
    /// Counted by a grant; a settle corrects it, a rollback gives it back.
    Pending,
    /// Settled: `counted` is the actual the count was corrected to.
    Settled,
    /// Rolled back: `counted` is 0.
    RolledBack,
}

impl IdStatus {
    /// The persisted code: 0 pending, 1 settled, 2 rolled back.
    pub fn code(self) -> u8 {
        match self {
            IdStatus::Pending => 0,
            IdStatus::Settled => 1,
            IdStatus::RolledBack => 2,
        }
    }

    /// The status of a persisted code, `None` for an unknown one.
    pub fn from_code(code: u8) -> Option<IdStatus> {
        match code {
            0 => Some(IdStatus::Pending),
            1 => Some(IdStatus::Settled),
            2 => Some(IdStatus::RolledBack),
            _ => None,
        }
    }

    /// The state's name in replies and errors.
    pub fn name(self) -> &'static str {
        match self {
            IdStatus::Pending => "pending",
            IdStatus::Settled => "settled",
            IdStatus::RolledBack => "rolledback",
        }
    }
}

/// One remembered id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The bucket the amount was counted in (the window's current precision); within
    /// ±2^61 ([`Remembered::holds_index`]).
    pub index: i64,
    /// What this id contributes to that bucket's count now, `>= 0`: the amount the grant
    /// counted while pending (what a retry must repeat), the actual once settled, 0 once rolled
    /// back.
    pub counted: i64,
    pub status: IdStatus,
}

/// A bucket index [`Remembered`] cannot hold (outside ±2^61), or one id too many (`u32::MAX`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unrepresentable;

/// The smallest bucket index a slot holds: −2^61.
const MIN_INDEX: i64 = -0x2000_0000_0000_0000;
/// The largest bucket index a slot holds: 2^61 − 1.
const MAX_INDEX: i64 = 0x1fff_ffff_ffff_ffff;
/// The low 62 bits of a slot's `key`: the index in two's complement.
const INDEX_MASK: u64 = 0x3fff_ffff_ffff_ffff;

/// Ids up to this many bytes are stored in the slot.
const INLINE: usize = 23;

/// Ids up to this many bytes keep their table hash in the slot's spare bytes (the last 4 of
/// the inline array), so that forgetting or rehashing them needs no SipHash.
const HASH_KEPT: usize = INLINE - 4;

/// An id's bytes in a queue slot (24 bytes: the length byte's niche tells the variants apart).
#[derive(Clone)]
enum SlotId {
    /// `len1` is the length plus one (never 0). An id of at most [`HASH_KEPT`] bytes has its
    /// [`TableHash`] in the last 4 bytes; every other byte past the length is 0.
    Inline {
        len1: NonZeroU8,
        bytes: [u8; INLINE],
    },
    /// Longer ids: one allocation of exactly their length.
    Heap(Box<[u8]>),
}

impl SlotId {
    /// The slot form of `id`, whose table hash is `h`.
    fn new(id: &[u8], h: TableHash) -> SlotId {
        let mut bytes = [0u8; INLINE];
        if id.len() <= HASH_KEPT {
            if let Some(tail) = bytes.get_mut(HASH_KEPT..) {
                tail.copy_from_slice(&h.0.to_le_bytes());
            }
        }
        match (bytes.get_mut(..id.len()), u8::try_from(id.len())) {
            (Some(head), Ok(len)) => {
                head.copy_from_slice(id);
                match NonZeroU8::new(len.saturating_add(1)) {
                    Some(len1) => SlotId::Inline { len1, bytes },
                    None => SlotId::Heap(id.into()),
                }
            }
            _ => SlotId::Heap(id.into()),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            SlotId::Inline { len1, bytes } => bytes
                .get(..usize::from(len1.get().saturating_sub(1)))
                .unwrap_or_default(),
            SlotId::Heap(b) => b,
        }
    }

    /// The table hash of the id: kept in the slot for a short id, worked out for a longer one.
    fn table_hash(&self) -> TableHash {
        if let SlotId::Inline { len1, bytes } = self {
            if usize::from(len1.get()) <= HASH_KEPT.saturating_add(1) {
                if let Some(Ok(kept)) = bytes.get(HASH_KEPT..).map(<[u8; 4]>::try_from) {
                    return TableHash(u32::from_le_bytes(kept));
                }
            }
        }
        hash_uncached(self.as_bytes())
    }

    /// Bytes allocated on the heap for it.
    fn heap_len(&self) -> usize {
        match self {
            SlotId::Inline { .. } => 0,
            SlotId::Heap(b) => b.len(),
        }
    }
}

/// An id and its entry, in the queue: 40 bytes.
#[derive(Clone)]
struct Slot {
    id: SlotId,
    /// The entry's status code in the top two bits, its index in the low 62 (two's
    /// complement).
    key: u64,
    counted: i64,
}

impl Slot {
    fn new(id: &[u8], h: TableHash, entry: Entry) -> Result<Slot, Unrepresentable> {
        Ok(Slot {
            id: SlotId::new(id, h),
            key: pack(entry.index, entry.status)?,
            counted: entry.counted,
        })
    }

    fn index(&self) -> i64 {
        // Sign-extends the low 62 bits.
        (self.key.wrapping_shl(2) as i64).wrapping_shr(2)
    }

    fn entry(&self) -> Entry {
        let status = match self.key.wrapping_shr(62) {
            1 => IdStatus::Settled,
            2 => IdStatus::RolledBack,
            // 0; 3 is never packed.
            _ => IdStatus::Pending,
        };
        Entry {
            index: self.index(),
            counted: self.counted,
            status,
        }
    }
}

fn pack(index: i64, status: IdStatus) -> Result<u64, Unrepresentable> {
    if !Remembered::holds_index(index) {
        return Err(Unrepresentable);
    }
    Ok((index as u64 & INDEX_MASK) | u64::from(status.code()).wrapping_shl(62))
}

impl PartialEq for Slot {
    fn eq(&self, other: &Self) -> bool {
        self.id.as_bytes() == other.id.as_bytes() && self.entry() == other.entry()
    }
}

impl Eq for Slot {}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Slot")
            .field(&String::from_utf8_lossy(self.id.as_bytes()))
            .field(&self.entry())
            .finish()
    }
}

/// The remembered ids of one window key.
#[derive(Clone, Default)]
pub struct Remembered {
    /// Nondecreasing bucket index, oldest first.
    slots: VecDeque<Slot>,
    /// Position in `slots` plus `shift`, per id (u32: at most `u32::MAX` ids, far above any
    /// `quota.max-pending` a key could hold in memory).
    table: HashTable<u32>,
    /// Added to a position when the front of the queue is popped, instead of rewriting the
    /// table: a slot at queue position `p` is stored as `p + shift` (wrapping).
    shift: u32,
}

/// The capacity a full queue of `len` slots grows to: by an eighth (at least 4), not by
/// doubling (ids are the memory of a busy window key; amortised: 8 moves per id), then up to
/// what the allocator's size class of those bytes holds anyway (jemalloc, Redis's allocator:
/// four classes per doubling above 128 bytes, as `crate::shell::memory::alloc_size`), so that
/// no rounding is wasted.
fn grown_capacity(len: usize) -> usize {
    const SLOT: usize = std::mem::size_of::<Slot>();
    let want = len.saturating_add((len / 8).max(4));
    let bytes = want.saturating_mul(SLOT);
    if bytes <= 128 {
        return want;
    }
    // bytes in (2^k, 2^(k+1)]: classes are 2^(k-2) apart.
    let k = usize::BITS
        .saturating_sub(bytes.saturating_sub(1).leading_zeros())
        .saturating_sub(1);
    let step = 1usize.checked_shl(k.saturating_sub(2)).unwrap_or(1);
    let class = bytes.div_ceil(step).saturating_mul(step);
    (class / SLOT).max(want)
}

/// The per-process keyed hasher (std's SipHash-1-3 with a random key). A faster keyed hash
/// (foldhash, aHash) is not used: their authors do not claim resistance to an attacker who
/// learns about the key from a long-running process's behaviour, which is what a server is.
fn hasher() -> &'static std::collections::hash_map::RandomState {
    static STATE: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    STATE.get_or_init(std::collections::hash_map::RandomState::new)
}

/// The 32 bits of an id's keyed hash that the table is indexed by: the top half of its SipHash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TableHash(u32);

impl TableHash {
    /// The 64-bit hash the table takes: the 32 bits twice, so that its bucket (the low bits)
    /// and its tag (the top 7 bits) both come from keyed bits, independent up to 2^25 buckets.
    fn wide(self) -> u64 {
        let h = u64::from(self.0);
        h.wrapping_shl(32) | h
    }
}

/// SipHash of the id's bytes (no length prefix: SipHash's last block holds the length),
/// reduced to the table's 32 bits.
fn hash_uncached(id: &[u8]) -> TableHash {
    let mut h = hasher().build_hasher();
    h.write(id);
    TableHash(h.finish().wrapping_shr(32) as u32)
}

/// Ids up to this long are memoised by [`hash`].
const MEMO_LEN: usize = 64;

/// The last id [`hash`] hashed and its hash: one multi-key command looks the same id up in
/// each of its window keys, at planning and again at applying (up to 6 lookups of one id for
/// a request with two windows). A pure function's cache, so it is per thread.
struct Memo {
    len: usize,
    bytes: [u8; MEMO_LEN],
    hash: TableHash,
}

thread_local! {
    static MEMO: std::cell::RefCell<Memo> = const {
        std::cell::RefCell::new(Memo {
            len: usize::MAX,
            bytes: [0; MEMO_LEN],
            hash: TableHash(0),
        })
    };
}

/// The hash of an id looked up or inserted (memoised: see [`Memo`]).
fn hash(id: &[u8]) -> TableHash {
    MEMO.with(|m| {
        let Ok(mut m) = m.try_borrow_mut() else {
            return hash_uncached(id);
        };
        if m.len == id.len() && m.bytes.get(..id.len()) == Some(id) {
            return m.hash;
        }
        let h = hash_uncached(id);
        if let Some(to) = m.bytes.get_mut(..id.len()) {
            to.copy_from_slice(id);
            m.len = id.len();
            m.hash = h;
        }
        h
    })
}

/// The queue position a table value stands for.
fn position_of(stored: u32, shift: u32) -> usize {
    stored.wrapping_sub(shift) as usize
}

impl Remembered {
    /// No ids (what a window without any shares).
    pub const EMPTY: Remembered = Remembered {
        slots: VecDeque::new(),
        table: HashTable::new(),
        shift: 0,
    };

    /// Whether a bucket index can be held (within −2^61 ..= 2^61 − 1; a window's indexes are
    /// unix ms divided by its precision, far inside).
    pub fn holds_index(index: i64) -> bool {
        (MIN_INDEX..=MAX_INDEX).contains(&index)
    }

    /// How many ids are remembered.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True if no id is remembered.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The queue position of `id`, whose hash is `h`.
    fn position(&self, id: &[u8], h: TableHash) -> Option<usize> {
        let (slots, shift) = (&self.slots, self.shift);
        self.table
            .find(h.wide(), |&stored| {
                slots
                    .get(position_of(stored, shift))
                    .is_some_and(|s| s.id.as_bytes() == id)
            })
            .map(|&stored| position_of(stored, shift))
    }

    /// Calls `out(address, bytes)` for both ends of the queue (where ids arrive and leave).
    /// Addresses only, for prefetching.
    pub fn hot_addresses(&self, out: &mut impl FnMut(*const u8, usize)) {
        queue_ends(&self.slots, out);
    }

    /// The entry of `id`, physically (whether its bucket is still in the window is the
    /// window's question).
    pub fn get(&self, id: &[u8]) -> Option<Entry> {
        self.position(id, hash(id))
            .and_then(|p| self.slots.get(p))
            .map(Slot::entry)
    }

    /// Inserts `id` (behind every id of an earlier bucket), or replaces its entry.
    ///
    /// # Errors
    ///
    /// [`Unrepresentable`] (nothing changed) for an index outside ±2^61 or a `u32::MAX`-th id.
    pub fn put(&mut self, id: &[u8], entry: Entry) -> Result<(), Unrepresentable> {
        let h = hash(id);
        let slot = Slot::new(id, h, entry)?;

        let in_order = self
            .slots
            .back()
            .is_none_or(|last| last.index() <= entry.index);
        let len = self.slots.len();
        let shift = self.shift;
        let slots = &self.slots;
        let found = self.table.entry(
            h.wide(),
            |&stored| {
                slots
                    .get(position_of(stored, shift))
                    .is_some_and(|s| s.id.as_bytes() == id)
            },
            |&stored| {
                slots
                    .get(position_of(stored, shift))
                    .map_or(0, |s| s.id.table_hash().wide())
            },
        );
        match found {
            TableEntry::Occupied(o) => {
                let p = position_of(*o.get(), shift);
                if let Some(old) = self.slots.get_mut(p) {
                    if old.index() == entry.index {
                        old.key = slot.key;
                        old.counted = slot.counted;
                        return Ok(());
                    }
                }
            }
            TableEntry::Vacant(v) if in_order => {
                let stored = u32::try_from(len).map_err(|_| Unrepresentable)?;
                v.insert(stored.wrapping_add(shift));
                if self.slots.len() == self.slots.capacity() {
                    self.slots
                        .reserve_exact(grown_capacity(len).saturating_sub(len));
                }
                self.slots.push_back(slot);
                return Ok(());
            }
            TableEntry::Vacant(_) => {}
        }
        // Out of order, or an id moving to another bucket: never on the command path (ids
        // arrive in time order); rebuilt.
        let mut all: Vec<Slot> = self
            .slots
            .drain(..)
            .filter(|s| s.id.as_bytes() != id)
            .collect();
        let at = all.partition_point(|s| s.index() <= entry.index);
        all.insert(at, slot);
        self.rebuild(all);
        Ok(())
    }

    /// Holds exactly `slots` (in their order), with a fresh table.
    fn rebuild(&mut self, slots: Vec<Slot>) {
        self.slots = slots.into();
        self.shift = 0;
        self.table = HashTable::with_capacity(self.slots.len());
        for (p, slot) in self.slots.iter().enumerate() {
            let Ok(p) = u32::try_from(p) else {
                break;
            };
            let slots = &self.slots;
            self.table
                .insert_unique(slot.id.table_hash().wide(), p, |&s| {
                    slots
                        .get(s as usize)
                        .map_or(0, |slot| slot.id.table_hash().wide())
                });
        }
    }

    /// The smallest bucket index of any id.
    pub fn oldest_index(&self) -> Option<i64> {
        self.slots.front().map(Slot::index)
    }

    /// How many ids have a bucket index below `index`: what [`Remembered::forget_before`]
    /// would remove. O(log n): the queue is ordered by index.
    pub fn count_before(&self, index: i64) -> usize {
        self.slots.partition_point(|s| s.index() < index)
    }

    /// Removes every id whose bucket index is below `index` (the oldest); returns how many.
    pub fn forget_before(&mut self, index: i64) -> usize {
        let mut n = 0usize;
        while let Some(front) = self.slots.front().filter(|s| s.index() < index) {
            let stored = self.shift;
            if let Ok(found) = self
                .table
                .find_entry(front.id.table_hash().wide(), |&s| s == stored)
            {
                found.remove();
            }
            self.slots.pop_front();
            self.shift = self.shift.wrapping_add(1);
            n = n.saturating_add(1);
        }
        if self.slots.is_empty() {
            // Give the memory back once nothing is held.
            *self = Remembered::default();
        } else if self.slots.capacity()
            > self
                .slots
                .len()
                .saturating_add(self.slots.len() / 2)
                .saturating_add(16)
        {
            self.slots
                .shrink_to(self.slots.len().saturating_add(self.slots.len() / 8));
            let (slots, shift) = (&self.slots, self.shift);
            self.table.shrink_to(slots.len(), |&s| {
                slots
                    .get(position_of(s, shift))
                    .map_or(0, |slot| slot.id.table_hash().wide())
            });
        }
        n
    }

    /// Moves every id to the bucket `f` maps its index to (a precision change), all or
    /// nothing. `f` should not decrease the order of indexes (buckets only move later,
    /// monotonically); the queue is re-sorted anyway.
    ///
    /// # Errors
    ///
    /// [`Unrepresentable`] (nothing changed) if `f` maps an index outside ±2^61.
    pub fn remap(&mut self, f: impl Fn(i64) -> i64) -> Result<(), Unrepresentable> {
        if !self.slots.iter().all(|s| Self::holds_index(f(s.index()))) {
            return Err(Unrepresentable);
        }
        let mut sorted = true;
        let mut last = i64::MIN;
        for s in self.slots.iter_mut() {
            let e = s.entry();
            let index = f(e.index);
            s.key = pack(index, e.status)?;
            sorted &= index >= last;
            last = index;
        }
        if !sorted {
            let mut all: Vec<Slot> = self.slots.drain(..).collect();
            all.sort_by_key(Slot::index);
            self.rebuild(all);
        }
        Ok(())
    }

    /// The ids with their entries, oldest bucket first (the persisted order).
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Entry)> + '_ {
        self.slots.iter().map(|s| (s.id.as_bytes(), s.entry()))
    }

    /// The sum of what the ids count in bucket `index`.
    pub fn counted_in(&self, index: i64) -> i128 {
        let from = self.slots.partition_point(|s| s.index() < index);
        self.slots
            .range(from..)
            .take_while(|s| s.index() == index)
            .fold(0i128, |t, s| t.saturating_add(i128::from(s.counted)))
    }

    /// The heap allocations, in bytes: the queue (by capacity, 40 bytes a slot), the table
    /// (4 bytes and a control byte per bucket, plus a group of control bytes), and the total
    /// of the ids longer than 23 bytes (one allocation each, each rounded by `size_class`: the
    /// allocator's usable size of a request, for MEMORY USAGE; the caller rounds the queue and
    /// table).
    pub fn allocations(&self, size_class: impl Fn(usize) -> usize) -> (usize, usize, usize) {
        let queue = self
            .slots
            .capacity()
            .saturating_mul(std::mem::size_of::<Slot>());
        let table = if self.table.capacity() == 0 {
            0
        } else {
            // hashbrown keeps its capacity at 7/8 of a power-of-two bucket count (all of it
            // below 8 buckets).
            let buckets = self
                .table
                .capacity()
                .saturating_mul(8)
                .div_ceil(7)
                .next_power_of_two();
            buckets
                .saturating_mul(std::mem::size_of::<u32>().saturating_add(1))
                .saturating_add(16)
        };
        let spilled: usize = self
            .slots
            .iter()
            .map(|s| s.id.heap_len())
            .filter(|&n| n > 0)
            .map(size_class)
            .fold(0usize, usize::saturating_add);
        (queue, table, spilled)
    }

    /// Heap bytes requested (the sum of [`Remembered::allocations`], unrounded).
    pub fn heap_bytes(&self) -> usize {
        let (queue, table, spilled) = self.allocations(|n| n);
        queue.saturating_add(table).saturating_add(spilled)
    }
}

impl PartialEq for Remembered {
    /// The same ids with the same entries in the same order (the table is derived).
    fn eq(&self, other: &Self) -> bool {
        self.slots == other.slots
    }
}

impl Eq for Remembered {}

impl std::fmt::Debug for Remembered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.slots.iter()).finish()
    }
}

/// Calls `out(address, bytes)` for the first and the last element of `q` (where a queue's
/// elements arrive and leave). Addresses only, for prefetching; shared with
/// [`crate::core::window::Window::hot_addresses`].
pub(crate) fn queue_ends<T>(q: &VecDeque<T>, out: &mut impl FnMut(*const u8, usize)) {
    for e in [q.front(), q.back()].into_iter().flatten() {
        out(std::ptr::from_ref::<T>(e).cast(), std::mem::size_of::<T>());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: i64, counted: i64) -> Entry {
        Entry {
            index,
            counted,
            status: IdStatus::Pending,
        }
    }

    #[test]
    fn forgets_oldest_first_and_finds_by_id() {
        let mut r = Remembered::default();
        r.put(b"b", entry(5, 1)).unwrap();
        r.put(b"a", entry(5, 4)).unwrap();
        r.put(b"c", entry(7, 2)).unwrap();
        assert_eq!(r.oldest_index(), Some(5));
        assert_eq!(r.counted_in(5), 5);
        assert_eq!(r.counted_in(7), 2);
        assert_eq!(r.counted_in(6), 0);
        // An update in place.
        r.put(b"a", entry(5, 0)).unwrap();
        assert_eq!(r.counted_in(5), 1);
        assert_eq!((r.count_before(5), r.count_before(6), r.count_before(8)), (0, 2, 3));
        assert_eq!(r.forget_before(6), 2);
        assert!(r.get(b"b").is_none());
        assert!(r.get(b"a").is_none());
        assert_eq!(r.get(b"c"), Some(entry(7, 2)));
        r.put(b"d", entry(9, 1)).unwrap();
        r.remap(|i| i / 2).unwrap();
        assert_eq!(r.counted_in(3), 2);
        assert_eq!(r.counted_in(4), 1);
        assert_eq!(r.forget_before(100), 2);
        assert!(r.is_empty());
        assert_eq!(r.heap_bytes(), 0);
    }

    /// Many ids through the queue: every one stays findable as the front is popped (the
    /// positions shift), and an out-of-order insert rebuilds.
    #[test]
    fn positions_survive_popping_and_rebuilding() {
        let mut r = Remembered::default();
        for i in 0..2000i64 {
            r.put(format!("id-{i}").as_bytes(), entry(i / 10, 1))
                .unwrap();
            if i % 7 == 0 {
                r.forget_before(i / 10 - 20);
            }
        }
        let first = r.oldest_index().unwrap();
        for i in 0..2000i64 {
            let found = r.get(format!("id-{i}").as_bytes()).is_some();
            assert_eq!(found, i / 10 >= first, "{i}");
        }
        r.put(b"early", entry(first, 3)).unwrap();
        assert_eq!(r.get(b"early"), Some(entry(first, 3)));
        assert_eq!(r.counted_in(first), 13);
        let ids: Vec<i64> = r.iter().map(|(_, e)| e.index).collect();
        assert!(ids.windows(2).all(|w| w[0] <= w[1]));
        for i in 0..2000i64 {
            let found = r.get(format!("id-{i}").as_bytes()).is_some();
            assert_eq!(found, i / 10 >= first, "{i}");
        }
    }

    /// The layout the memory figures rest on: 40 bytes a slot (the id's two variants share
    /// 24 bytes through the length byte's niche).
    #[test]
    fn a_slot_is_40_bytes() {
        assert_eq!(std::mem::size_of::<SlotId>(), 24);
        assert_eq!(std::mem::size_of::<Slot>(), 40);
    }

    /// Every status and index at the edges of the range, and ids around the inline length,
    /// come back as they went in; the heap holds exactly the long ids' bytes.
    #[test]
    fn entries_and_ids_round_trip() {
        let mut r = Remembered::default();
        let mut expected = Vec::new();
        let indexes = [MIN_INDEX, -1, 0, 1, 1 << 40, MAX_INDEX];
        for (n, &index) in indexes.iter().enumerate() {
            for (k, status) in [IdStatus::Pending, IdStatus::Settled, IdStatus::RolledBack]
                .into_iter()
                .enumerate()
            {
                let len = [0usize, 1, 22, 23, 24, 200][(n + k) % 6];
                let id: Vec<u8> = (0..len).map(|i| (i * 7 + n * 3 + k) as u8).collect();
                let id = [id, format!("#{n}.{k}").into_bytes()].concat();
                let e = Entry {
                    index,
                    counted: [0, 1, i64::MAX][k],
                    status,
                };
                r.put(&id, e).unwrap();
                expected.push((id, e));
            }
        }
        for (id, e) in &expected {
            assert_eq!(r.get(id), Some(*e), "{id:?}");
        }
        let listed: Vec<(Vec<u8>, Entry)> = r.iter().map(|(id, e)| (id.to_vec(), e)).collect();
        assert_eq!(listed, expected);
        let long: usize = expected
            .iter()
            .map(|(id, _)| id.len())
            .filter(|&l| l > INLINE)
            .sum();
        assert_eq!(r.allocations(|n| n).2, long);
        let rounded: usize = expected
            .iter()
            .map(|(id, _)| id.len())
            .filter(|&l| l > INLINE)
            .map(crate::shell::memory::alloc_size)
            .sum();
        assert_eq!(r.allocations(crate::shell::memory::alloc_size).2, rounded);
        assert!(r.get(b"").is_none());
        r.put(b"", entry(MAX_INDEX, 4)).unwrap();
        assert_eq!(r.get(b""), Some(entry(MAX_INDEX, 4)));
    }

    /// An index outside ±2^61 is refused and changes nothing; so is a remap to one.
    #[test]
    fn unrepresentable_indexes_are_refused() {
        let mut r = Remembered::default();
        r.put(b"a", entry(10, 1)).unwrap();
        let before = r.clone();
        for index in [i64::MIN, MIN_INDEX - 1, MAX_INDEX + 1, i64::MAX] {
            assert_eq!(r.put(b"b", entry(index, 1)), Err(Unrepresentable));
            assert_eq!(r.put(b"a", entry(index, 1)), Err(Unrepresentable));
            assert_eq!(r, before);
        }
        r.put(b"b", entry(20, 1)).unwrap();
        let before = r.clone();
        assert_eq!(
            r.remap(|i| if i == 20 { MAX_INDEX + 1 } else { i }),
            Err(Unrepresentable)
        );
        assert_eq!(r, before);
        r.remap(|i| i - 100).unwrap();
        assert_eq!(r.oldest_index(), Some(-90));
        assert_eq!(r.get(b"b"), Some(entry(-80, 1)));
    }

    /// The memo answers what SipHash answers, whichever ids come in turn (short, empty, longer
    /// than the memo, one a prefix of another).
    #[test]
    fn memoised_hashes_are_the_hashes() {
        let long = vec![7u8; MEMO_LEN + 1];
        let ids: [&[u8]; 6] = [b"a", b"", b"ab", b"a", &long, &long[..MEMO_LEN]];
        for _ in 0..3 {
            for id in ids {
                assert_eq!(hash(id), hash_uncached(id));
                assert_eq!(hash(id), hash_uncached(id));
            }
        }
        assert_ne!(hash(b"a"), hash(b"b"));
    }

    /// A grown queue takes at least an eighth more and fills its size class.
    #[test]
    fn a_kept_table_hash_is_the_ids_hash() {
        for len in 0..=40usize {
            let id: Vec<u8> = (0..len).map(|i| (i * 37 + len) as u8).collect();
            let slot = SlotId::new(&id, hash_uncached(&id));
            assert_eq!(slot.as_bytes(), &id[..]);
            assert_eq!(slot.table_hash(), hash_uncached(&id), "{len}");
        }
    }

    #[test]
    fn growth_fills_the_size_class() {
        let slot = std::mem::size_of::<Slot>();
        for len in (0..5000).chain([100_000, 1 << 20]) {
            let cap = grown_capacity(len);
            assert!(cap >= len + (len / 8).max(4), "{len}");
            let class = crate::shell::memory::alloc_size(cap * slot);
            if cap * slot > 128 {
                assert!(
                    class - cap * slot < slot,
                    "{len}: {cap} slots in {class} bytes"
                );
            }
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// An id (one of 24, of 1 to 40 bytes) put at the newest index plus 0 to 2, with a
        /// count and a status code.
        Put(u8, usize, i64, i64, u8),
        /// An id put at any index (out of order, or moved: the rebuilding path).
        PutAt(u8, usize, i64, i64),
        Forget(i64),
        Remap(i64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u8..24, 1usize..40, 0i64..3, 0i64..1000, 0u8..3)
                .prop_map(|(i, l, a, c, s)| Op::Put(i, l, a, c, s)),
            1 => (0u8..24, 1usize..40, -5i64..60, 0i64..1000)
                .prop_map(|(i, l, x, c)| Op::PutAt(i, l, x, c)),
            2 => (-5i64..60).prop_map(Op::Forget),
            1 => (1i64..4).prop_map(Op::Remap),
        ]
    }

    /// Id number `i`: below 8, its first byte is `i`; from 8, stream-style `<len>-<i>`
    /// (canonical, so known absent above the largest put), from 16 the same with a leading
    /// zero (not canonical). Ids of different numbers differ; the model keeps the length of
    /// its first use, so one number is one id.
    fn id_of(i: u8, len: usize) -> Vec<u8> {
        let len = len.clamp(1, 40);
        match i {
            0..8 => {
                let mut id = vec![b'a' + i; len];
                id[0] = i;
                id
            }
            8..16 => format!("{len}-{i}").into_bytes(),
            _ => format!("0{len}-{i}").into_bytes(),
        }
    }

    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any sequence of puts (in order, out of order, replacing), forgets and remaps leaves
        /// the same ids, entries and order as a plain list kept sorted by index (stable), and
        /// every id is found by its bytes.
        #[test]
        fn matches_a_sorted_list(ops in proptest::collection::vec(op(), 1..120)) {
            let mut r = Remembered::default();
            let mut model: Vec<(Vec<u8>, Entry)> = Vec::new();
            let mut lens = std::collections::HashMap::new();
            for op in ops {
                let (id, e) = match op {
                    Op::Put(i, len, ahead, counted, s) => {
                        let len = *lens.entry(i).or_insert(len);
                        let newest = model.last().map_or(0, |(_, e)| e.index);
                        let status = IdStatus::from_code(s).unwrap();
                        (id_of(i, len), Entry { index: newest + ahead, counted, status })
                    }
                    Op::PutAt(i, len, index, counted) => {
                        let len = *lens.entry(i).or_insert(len);
                        (id_of(i, len), Entry { index, counted, status: IdStatus::Pending })
                    }
                    Op::Forget(index) => {
                        let n = model.iter().take_while(|(_, e)| e.index < index).count();
                        model.drain(..n);
                        prop_assert_eq!(r.count_before(index), n);
                        prop_assert_eq!(r.forget_before(index), n);
                        continue;
                    }
                    Op::Remap(d) => {
                        for (_, e) in model.iter_mut() {
                            e.index /= d;
                        }
                        model.sort_by_key(|(_, e)| e.index);
                        r.remap(|i| i / d).unwrap();
                        continue;
                    }
                };
                r.put(&id, e).unwrap();
                match model.iter().position(|(x, _)| *x == id) {
                    Some(p) if model[p].1.index == e.index => model[p].1 = e,
                    p => {
                        if let Some(p) = p {
                            model.remove(p);
                        }
                        let at = model.partition_point(|(_, x)| x.index <= e.index);
                        model.insert(at, (id, e));
                    }
                }
            }
            let listed: Vec<(Vec<u8>, Entry)> = r.iter().map(|(id, e)| (id.to_vec(), e)).collect();
            prop_assert_eq!(&listed, &model);
            prop_assert_eq!(r.len(), model.len());
            // Every id forgotten left the table too (found through its kept hash).
            prop_assert_eq!(r.table.len(), r.slots.len());
            prop_assert_eq!(r.oldest_index(), model.first().map(|(_, e)| e.index));
            for (id, e) in &model {
                prop_assert_eq!(r.get(id), Some(*e));
                let sum: i128 = model
                    .iter()
                    .filter(|(_, x)| x.index == e.index)
                    .map(|(_, x)| i128::from(x.counted))
                    .sum();
                prop_assert_eq!(r.counted_in(e.index), sum);
            }
            for i in 0u8..24 {
                let id = id_of(i, *lens.get(&i).unwrap_or(&1));
                if !model.iter().any(|(x, _)| *x == id) {
                    prop_assert!(r.get(&id).is_none());
                }
            }
        }
    }

    #[test]
    fn status_codes_round_trip() {
        for s in [IdStatus::Pending, IdStatus::Settled, IdStatus::RolledBack] {
            assert_eq!(IdStatus::from_code(s.code()), Some(s));
        }
        assert_eq!(IdStatus::from_code(3), None);
    }
}
