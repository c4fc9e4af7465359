//! The reservation ids a configured window key remembers (multi-key admission, issue 19):
//! `id → (bucket index, amount counted, status)`, ordered both by id (lookups) and by bucket
//! index (forgetting the ids whose bucket left the window, oldest first). Storage only: the
//! rules (when an id is alive, what a correction does to the buckets) are
//! [`crate::core::window::Window`]'s.
//!
//! Memory: an id costs its [`Id`] twice (32 bytes each, inline up to 24 bytes), its entry (24
//! bytes) and its index key (8 bytes), about 100 bytes with the B-tree nodes. An empty set owns
//! no heap.

use std::collections::{BTreeMap, BTreeSet};

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
    /// What this id contributes to that bucket's count now, `>= 0`.
    pub counted: i64,
    /// The amount the grant counted (what a retry must repeat).
    pub amount: i64,
    pub status: IdStatus,
}

/// The remembered ids of one window key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Remembered {
    by_id: BTreeMap<Id, Entry>,
    by_index: BTreeSet<(i64, Id)>,
}

impl Remembered {
    /// No ids (what a window without any shares).
    pub const EMPTY: Remembered = Remembered {
        by_id: BTreeMap::new(),
        by_index: BTreeSet::new(),
    };

    /// How many ids are remembered.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// True if no id is remembered.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The entry of `id`, physically (whether its bucket is still in the window is the
    /// window's question).
    pub fn get(&self, id: &[u8]) -> Option<&Entry> {
        self.by_id.get(id)
    }

    /// Inserts or replaces `id`'s entry.
    pub fn put(&mut self, id: &[u8], entry: Entry) {
        if let Some(old) = self.by_id.insert(Id::from_slice(id), entry) {
            self.by_index.remove(&(old.index, Id::from_slice(id)));
        }
        self.by_index.insert((entry.index, Id::from_slice(id)));
    }

    /// The smallest bucket index of any id.
    pub fn oldest_index(&self) -> Option<i64> {
        self.by_index.first().map(|(index, _)| *index)
    }

    /// Removes every id whose bucket index is below `index`; returns how many.
    pub fn forget_before(&mut self, index: i64) -> usize {
        let mut n = 0usize;
        while let Some((i, _)) = self.by_index.first() {
            if *i >= index {
                break;
            }
            if let Some((_, id)) = self.by_index.pop_first() {
                self.by_id.remove(&id);
                n = n.saturating_add(1);
            }
        }
        n
    }

    /// Moves every id to the bucket `f` maps its index to (a precision change). `f` must not
    /// decrease the order of indexes (it does not: buckets only move later, monotonically).
    pub fn remap(&mut self, f: impl Fn(i64) -> i64) {
        for entry in self.by_id.values_mut() {
            entry.index = f(entry.index);
        }
        self.by_index = self
            .by_id
            .iter()
            .map(|(id, e)| (e.index, id.clone()))
            .collect();
    }

    /// The ids with their entries, in id order (the persisted order).
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &Entry)> + '_ {
        self.by_id.iter().map(|(id, e)| (&id[..], e))
    }

    /// The sum of what the ids count in bucket `index`.
    pub fn counted_in(&self, index: i64) -> i128 {
        self.by_index
            .range((index, Id::new())..)
            .take_while(|(i, _)| *i == index)
            .filter_map(|(_, id)| self.by_id.get(id))
            .fold(0i128, |t, e| t.saturating_add(i128::from(e.counted)))
    }

    /// Heap bytes, estimated: per id the two keys, the entry, and B-tree node overhead
    /// (about a third), plus spilled ids.
    pub fn heap_bytes(&self) -> usize {
        let per = std::mem::size_of::<Id>()
            .saturating_mul(2)
            .saturating_add(std::mem::size_of::<Entry>())
            .saturating_add(std::mem::size_of::<i64>());
        let spilled: usize = self
            .by_id
            .keys()
            .filter(|id| id.spilled())
            .map(|id| id.len().saturating_mul(2))
            .fold(0usize, usize::saturating_add);
        per.saturating_mul(self.len())
            .saturating_mul(4)
            .checked_div(3)
            .unwrap_or(0)
            .saturating_add(spilled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: i64, counted: i64) -> Entry {
        Entry {
            index,
            counted,
            amount: counted,
            status: IdStatus::Pending,
        }
    }

    #[test]
    fn forgets_oldest_first_and_keeps_both_orders() {
        let mut r = Remembered::default();
        r.put(b"b", entry(5, 1));
        r.put(b"a", entry(7, 2));
        r.put(b"c", entry(5, 4));
        assert_eq!(r.oldest_index(), Some(5));
        assert_eq!(r.counted_in(5), 5);
        assert_eq!(r.counted_in(7), 2);
        r.put(b"c", entry(7, 4));
        assert_eq!(r.counted_in(7), 6);
        assert_eq!(r.forget_before(7), 1);
        assert!(r.get(b"b").is_none());
        assert_eq!(r.len(), 2);
        r.remap(|i| i / 2);
        assert_eq!(r.counted_in(3), 6);
        assert_eq!(r.forget_before(100), 2);
        assert!(r.is_empty());
        assert_eq!(r.heap_bytes(), 0);
    }

    #[test]
    fn status_codes_round_trip() {
        for s in [IdStatus::Pending, IdStatus::Settled, IdStatus::RolledBack] {
            assert_eq!(IdStatus::from_code(s.code()), Some(s));
        }
        assert_eq!(IdStatus::from_code(3), None);
    }
}
