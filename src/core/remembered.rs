//! The reservation ids a configured window key remembers (multi-key admission, issue 19):
//! `id → (bucket index, amount counted, status)`. Storage only: the rules (when an id is
//! alive, what a correction does to the buckets) are [`crate::core::window::Window`]'s.
//!
//! Ids arrive in the order of their bucket (time never goes backwards for a key) and leave it
//! oldest first, so they are kept in one queue in that order — which is also the persisted
//! order — and found by id through a hash table of their positions in the queue
//! (`hashbrown::HashTable<u32>`, SipHash keyed per process: client ids cannot be chosen to
//! collide). Each id is stored once.
//!
//! Memory: 56 bytes per id in the queue (the [`Id`], inline up to 24 bytes, and its entry),
//! grown by an eighth at a time, and 5 bytes per slot of the table (at most 7/8 full, grown by
//! doubling): 60 to 90 bytes per id with allocator rounding; see [`Remembered::allocations`].
//! An empty set owns no heap.

use std::collections::VecDeque;
use std::hash::BuildHasher;

use hashbrown::HashTable;

use crate::core::book::Id;

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
    /// The bucket the amount was counted in (the window's current precision).
    pub index: i64,
    /// What this id contributes to that bucket's count now, `>= 0`: the amount the grant
    /// counted while pending (what a retry must repeat), the actual once settled, 0 once rolled
    /// back.
    pub counted: i64,
    pub status: IdStatus,
}

/// An id and its entry, in the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Slot {
    id: Id,
    entry: Entry,
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

/// The per-process keyed hasher (std's SipHash).
fn hasher() -> &'static std::collections::hash_map::RandomState {
    static STATE: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    STATE.get_or_init(std::collections::hash_map::RandomState::new)
}

fn hash(id: &[u8]) -> u64 {
    hasher().hash_one(id)
}

impl Remembered {
    /// No ids (what a window without any shares).
    pub const EMPTY: Remembered = Remembered {
        slots: VecDeque::new(),
        table: HashTable::new(),
        shift: 0,
    };

    /// How many ids are remembered.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True if no id is remembered.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The queue position of `id`.
    fn position(&self, id: &[u8]) -> Option<usize> {
        let (slots, shift) = (&self.slots, self.shift);
        self.table
            .find(hash(id), |&stored| {
                let p = stored.wrapping_sub(shift) as usize;
                slots.get(p).is_some_and(|s| s.id[..] == *id)
            })
            .map(|&stored| stored.wrapping_sub(shift) as usize)
    }

    /// The entry of `id`, physically (whether its bucket is still in the window is the
    /// window's question).
    pub fn get(&self, id: &[u8]) -> Option<&Entry> {
        self.position(id)
            .and_then(|p| self.slots.get(p))
            .map(|s| &s.entry)
    }

    /// Inserts `id` (behind every id of an earlier bucket), or replaces its entry.
    pub fn put(&mut self, id: &[u8], entry: Entry) {
        if let Some(slot) = self.position(id).and_then(|p| self.slots.get_mut(p)) {
            if slot.entry.index == entry.index {
                slot.entry = entry;
                return;
            }
        }
        let in_order = self
            .slots
            .back()
            .is_none_or(|last| last.entry.index <= entry.index);
        if in_order && self.position(id).is_none() {
            let Ok(stored) = u32::try_from(self.slots.len()) else {
                return;
            };
            if self.slots.len() == self.slots.capacity() {
                // Grow by an eighth, not by doubling: a full queue wastes at most 1/8 (ids are
                // the memory of a busy window key). Amortised: 8 moves per id.
                self.slots.reserve_exact((self.slots.len() / 8).max(4));
            }
            self.slots.push_back(Slot {
                id: Id::from_slice(id),
                entry,
            });
            let stored = stored.wrapping_add(self.shift);
            let (slots, shift) = (&self.slots, self.shift);
            self.table.insert_unique(hash(id), stored, |&s| {
                let p = s.wrapping_sub(shift) as usize;
                slots.get(p).map_or(0, |slot| hash(&slot.id))
            });
            return;
        }
        // Out of order, or an id moving to another bucket: never on the command path (ids
        // arrive in time order); rebuilt.
        let mut all: Vec<Slot> = self.slots.drain(..).filter(|s| s.id[..] != *id).collect();
        let at = all.partition_point(|s| s.entry.index <= entry.index);
        all.insert(
            at,
            Slot {
                id: Id::from_slice(id),
                entry,
            },
        );
        self.rebuild(all);
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
            self.table.insert_unique(hash(&slot.id), p, |&s| {
                slots.get(s as usize).map_or(0, |slot| hash(&slot.id))
            });
        }
    }

    /// The smallest bucket index of any id.
    pub fn oldest_index(&self) -> Option<i64> {
        self.slots.front().map(|s| s.entry.index)
    }

    /// Removes every id whose bucket index is below `index` (the oldest); returns how many.
    pub fn forget_before(&mut self, index: i64) -> usize {
        let mut n = 0usize;
        while self.slots.front().is_some_and(|s| s.entry.index < index) {
            let Some(front) = self.slots.front() else {
                break;
            };
            let stored = self.shift;
            if let Ok(found) = self.table.find_entry(hash(&front.id), |&s| s == stored) {
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
            self.table.shrink_to(self.slots.len(), |&s| {
                let p = s.wrapping_sub(self.shift) as usize;
                self.slots.get(p).map_or(0, |slot| hash(&slot.id))
            });
        }
        n
    }

    /// Moves every id to the bucket `f` maps its index to (a precision change). `f` must not
    /// decrease the order of indexes (buckets only move later, monotonically); the queue is
    /// re-sorted anyway.
    pub fn remap(&mut self, f: impl Fn(i64) -> i64) {
        let mut sorted = true;
        let mut last = i64::MIN;
        for s in self.slots.iter_mut() {
            s.entry.index = f(s.entry.index);
            sorted &= s.entry.index >= last;
            last = s.entry.index;
        }
        if !sorted {
            let mut all: Vec<Slot> = self.slots.drain(..).collect();
            all.sort_by_key(|s| s.entry.index);
            self.rebuild(all);
        }
    }

    /// The ids with their entries, oldest bucket first (the persisted order).
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &Entry)> + '_ {
        self.slots.iter().map(|s| (&s.id[..], &s.entry))
    }

    /// The sum of what the ids count in bucket `index`.
    pub fn counted_in(&self, index: i64) -> i128 {
        let from = self.slots.partition_point(|s| s.entry.index < index);
        self.slots
            .range(from..)
            .take_while(|s| s.entry.index == index)
            .fold(0i128, |t, s| t.saturating_add(i128::from(s.entry.counted)))
    }

    /// The heap allocations, in bytes: the queue (by capacity), the table (4 bytes and a
    /// control byte per bucket, plus a group of control bytes), and the total of the ids
    /// longer than 24 bytes (one allocation each).
    pub fn allocations(&self) -> (usize, usize, usize) {
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
            .filter(|s| s.id.spilled())
            .map(|s| s.id.len())
            .fold(0usize, usize::saturating_add);
        (queue, table, spilled)
    }

    /// Heap bytes (the sum of [`Remembered::allocations`]).
    pub fn heap_bytes(&self) -> usize {
        let (queue, table, spilled) = self.allocations();
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
        r.put(b"b", entry(5, 1));
        r.put(b"a", entry(5, 4));
        r.put(b"c", entry(7, 2));
        assert_eq!(r.oldest_index(), Some(5));
        assert_eq!(r.counted_in(5), 5);
        assert_eq!(r.counted_in(7), 2);
        assert_eq!(r.counted_in(6), 0);
        // An update in place.
        r.put(b"a", entry(5, 0));
        assert_eq!(r.counted_in(5), 1);
        assert_eq!(r.forget_before(6), 2);
        assert!(r.get(b"b").is_none());
        assert!(r.get(b"a").is_none());
        assert_eq!(r.get(b"c"), Some(&entry(7, 2)));
        r.put(b"d", entry(9, 1));
        r.remap(|i| i / 2);
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
            r.put(format!("id-{i}").as_bytes(), entry(i / 10, 1));
            if i % 7 == 0 {
                r.forget_before(i / 10 - 20);
            }
        }
        let first = r.oldest_index().unwrap();
        for i in 0..2000i64 {
            let found = r.get(format!("id-{i}").as_bytes()).is_some();
            assert_eq!(found, i / 10 >= first, "{i}");
        }
        r.put(b"early", entry(first, 3));
        assert_eq!(r.get(b"early"), Some(&entry(first, 3)));
        assert_eq!(r.counted_in(first), 13);
        let ids: Vec<i64> = r.iter().map(|(_, e)| e.index).collect();
        assert!(ids.windows(2).all(|w| w[0] <= w[1]));
        for i in 0..2000i64 {
            let found = r.get(format!("id-{i}").as_bytes()).is_some();
            assert_eq!(found, i / 10 >= first, "{i}");
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
