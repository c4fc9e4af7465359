//! MEMORY USAGE of module values: what the value really holds in Redis's allocator.
//!
//! Redis sizes its own values by the allocator's usable sizes (`used_memory` counts jemalloc size
//! classes, not requested bytes), so these estimates do the same: each allocation the value owns
//! is rounded up to its jemalloc size class. The layouts modelled here are those of
//! [`crate::core::book`] and [`crate::core::window`]; `tests/resource_caps.rs` compares the result
//! with the memory a `DEL` of large keys gives back (within 10 %), so a storage change that these
//! models no longer describe fails there.

use std::mem::size_of;

use crate::core::book::{Entry, Id};
use crate::core::ledger::Budget;
use crate::core::window::Window;

/// The usable size jemalloc (Redis's default allocator) gives a request of `n` bytes: 8, then
/// multiples of 16 up to 128, then four classes per doubling (`2^k + i * 2^(k-2)`).
pub fn alloc_size(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    if n <= 8 {
        return 8;
    }
    if n <= 128 {
        return n.div_ceil(16).saturating_mul(16);
    }
    // n in (2^k, 2^(k+1)]: classes are spaced 2^(k-2) apart.
    let k = usize::BITS
        .saturating_sub(n.saturating_sub(1).leading_zeros())
        .saturating_sub(1);
    let step = 1usize
        .checked_shl(k.saturating_sub(2))
        .unwrap_or(usize::MAX);
    n.div_ceil(step).saturating_mul(step)
}

/// Bytes of a Rust `BTreeMap<K, V>` leaf node: parent pointer, parent index and length, then
/// room for 11 keys and 11 values, aligned to 8.
fn btree_leaf(key: usize, value: usize) -> usize {
    let raw = key
        .saturating_add(value)
        .saturating_mul(11)
        .saturating_add(12);
    raw.div_ceil(8).saturating_mul(8)
}

/// Node bytes of a B-tree of `n` elements whose leaves take `leaf` bytes. One leaf up to 11
/// elements; beyond, leaves are filled to between 6/11 (sorted inserts) and about 2/3 (random
/// inserts): 6.5 elements per leaf, internal nodes included, measured within a few percent
/// against Redis's own accounting for both patterns.
fn btree_nodes(n: usize, leaf: usize) -> usize {
    let leaf = alloc_size(leaf);
    match n {
        0 => 0,
        1..=11 => leaf,
        _ => n.saturating_mul(leaf).saturating_mul(2) / 13,
    }
}

/// MEMORY USAGE of a budget: the boxed struct, its time-zone name, and the reservation book —
/// one `id → entry` map holding every id, a `(deadline, id)` index of pending reservations and a
/// `(finished, id)` index of finished ids; each id is allocated twice (map key and index key).
pub fn budget_bytes(b: &Budget) -> usize {
    let book = b.book();
    let mut ids = 0usize;
    for (id, _) in book.entries() {
        ids = ids.saturating_add(alloc_size(id.len()).saturating_mul(2));
    }
    let all = book.pending_len().saturating_add(book.finished_len());
    let map = btree_nodes(all, btree_leaf(size_of::<Id>(), size_of::<Entry>()));
    let index_leaf = btree_leaf(size_of::<(i64, Id)>(), 0);
    let by_deadline = btree_nodes(book.pending_len(), index_leaf);
    let by_finish = btree_nodes(book.finished_len(), index_leaf);
    alloc_size(size_of::<Budget>())
        .saturating_add(alloc_size(b.period().tz.len()))
        .saturating_add(ids)
        .saturating_add(map)
        .saturating_add(by_deadline)
        .saturating_add(by_finish)
}

/// MEMORY USAGE of a window: the boxed struct and its bucket storage, two arrays of the same
/// capacity — 4-byte offsets and 8-byte counts, i.e. a third and two thirds of
/// [`Window::heap_bytes`] — each one allocation.
pub fn window_bytes(w: &Window) -> usize {
    let heap = w.heap_bytes();
    let offsets = heap / 3;
    let counts = heap.saturating_sub(offsets);
    alloc_size(size_of::<Window>())
        .saturating_add(alloc_size(offsets))
        .saturating_add(alloc_size(counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jemalloc_size_classes() {
        let cases = [
            (0, 0),
            (1, 8),
            (8, 8),
            (9, 16),
            (17, 32),
            (36, 48),
            (128, 128),
            (129, 160),
            (232, 256),
            (280, 320),
            (544, 640),
            (4096, 4096),
            (16388, 20480),
            (32776, 40960),
            (usize::MAX, usize::MAX),
        ];
        for (n, class) in cases {
            assert_eq!(alloc_size(n), class, "{n}");
        }
    }

    #[test]
    fn btree_leaf_layout() {
        assert_eq!(btree_leaf(16, 32), 544);
        assert_eq!(btree_leaf(24, 0), 280);
    }
}
