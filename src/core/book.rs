//! The reservation book of one budget: pending reservations and remembered finished ids, with
//! the two orders the ledger needs (by id for lookups, by deadline for expiry, by finish time for
//! forgetting). Storage only: the rules live in [`crate::core::ledger`].
//!
//! Every structure is a B-tree so iteration order (and therefore the persisted bytes and the
//! digest) is deterministic and every operation is O(log n) in the key's entries.

use std::collections::{BTreeMap, BTreeSet};

/// A reservation or charge id: 1..=max-id-length arbitrary bytes.
pub type Id = Box<[u8]>;

/// A pending reservation. Times are unix ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// Units held back from `available` until settle, rollback or expiry.
    pub amount: i64,
    /// When it was granted.
    pub created_ms: i64,
    /// It expires when `now >= deadline_ms`.
    pub deadline_ms: i64,
}

/// How a finished id ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Settled for `actual` units (`late`: after the reservation had expired).
    Settled { actual: i64, late: bool },
    /// Rolled back; `amount` was released.
    RolledBack { amount: i64 },
    /// Expired; `amount` was released.
    Expired { amount: i64 },
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
}

/// A remembered finished id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    pub outcome: Outcome,
    /// When it finished (for an expiry: the deadline, so that swept and unswept expiries are
    /// remembered for exactly as long). It is forgotten once `now >= finished_ms + keep`.
    pub finished_ms: i64,
}

/// One id's physical entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    Pending(Reservation),
    Finished(Finished),
}

/// Pending reservations and finished ids of one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Book {
    entries: BTreeMap<Id, Entry>,
    by_deadline: BTreeSet<(i64, Id)>,
    by_finish: BTreeSet<(i64, Id)>,
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

    pub fn get(&self, id: &[u8]) -> Option<&Entry> {
        self.entries.get(id)
    }

    /// Pending reservations, soonest deadline first, as `(deadline_ms, id)`.
    pub fn by_deadline(&self) -> impl Iterator<Item = &(i64, Id)> {
        self.by_deadline.iter()
    }

    /// Pending reservations with `deadline > after_ms`, soonest first.
    pub fn live_after(&self, after_ms: i64) -> impl Iterator<Item = (&Id, &Reservation)> {
        // Nothing can be live after the end of time (avoids a saturating off-by-one).
        let start = after_ms.saturating_add(1);
        let end_of_time = after_ms == i64::MAX;
        self.by_deadline
            .range((start, Id::default())..)
            .filter(move |_| !end_of_time)
            .filter_map(|(_, id)| match self.entries.get(id) {
                Some(Entry::Pending(r)) => Some((id, r)),
                _ => None,
            })
    }

    /// Finished ids, earliest finish first, as `(finished_ms, id)`.
    pub fn by_finish(&self) -> impl Iterator<Item = &(i64, Id)> {
        self.by_finish.iter()
    }

    /// All entries in id order (for persistence and digests).
    pub fn entries(&self) -> impl Iterator<Item = (&Id, &Entry)> {
        self.entries.iter()
    }

    /// Inserts or replaces an entry, keeping the indexes in step.
    pub fn put(&mut self, id: Id, entry: Entry) {
        self.remove(&id);
        match entry {
            Entry::Pending(r) => {
                self.by_deadline.insert((r.deadline_ms, id.clone()));
            }
            Entry::Finished(f) => {
                self.by_finish.insert((f.finished_ms, id.clone()));
            }
        }
        self.entries.insert(id, entry);
    }

    /// Removes an id, returning its entry.
    pub fn remove(&mut self, id: &[u8]) -> Option<Entry> {
        let (key, entry) = self.entries.remove_entry(id)?;
        match entry {
            Entry::Pending(r) => {
                self.by_deadline.remove(&(r.deadline_ms, key));
            }
            Entry::Finished(f) => {
                self.by_finish.remove(&(f.finished_ms, key));
            }
        }
        Some(entry)
    }

    /// Approximate heap bytes (for MEMORY USAGE): per entry the map slot, the index slot and the
    /// boxed id twice, plus B-tree node slack.
    pub fn heap_bytes(&self) -> usize {
        const SLOT: usize = std::mem::size_of::<Id>() + std::mem::size_of::<Entry>();
        const INDEX: usize = std::mem::size_of::<(i64, Id)>();
        let mut ids = 0usize;
        for id in self.entries.keys() {
            // Allocators round small blocks up to 8/16 bytes.
            ids = ids.saturating_add(id.len().max(8).next_multiple_of(8));
        }
        let per = SLOT.saturating_add(INDEX);
        // B-tree leaves are ~2/3 full on average.
        let slots = self.entries.len().saturating_mul(per).saturating_mul(3) / 2;
        slots.saturating_add(ids.saturating_mul(2))
    }
}
