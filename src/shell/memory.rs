//! MEMORY USAGE of module values: what the value really holds in Redis's allocator.
//!
//! Redis sizes its own values by the allocator's usable sizes (`used_memory` counts jemalloc size
//! classes, not requested bytes), so these estimates do the same: each allocation the value owns
//! is rounded up to its jemalloc size class. The layouts modelled here are those of
//! [`crate::core::book`] and [`crate::core::window`]; `tests/resource_caps.rs` compares the result
//! with the memory a `DEL` of large keys gives back (within 10 %), so a storage change that these
//! models no longer describe fails there.

use std::mem::size_of;

use crate::core::ledger::Budget;
use crate::core::size_class::alloc_size;
use crate::core::window::Window;

/// MEMORY USAGE of a budget: the boxed struct, its time-zone name, and every allocation of the
/// reservation book ([`crate::core::book::Book::allocations`]: slab chunks, index nodes, long
/// ids), each rounded up to its size class.
pub fn budget_bytes(b: &Budget) -> usize {
    let mut book = 0usize;
    b.book().allocations(|bytes, count| {
        book = book.saturating_add(alloc_size(bytes).saturating_mul(count));
    });
    alloc_size(size_of::<Budget>())
        .saturating_add(alloc_size(b.period().tz.len()))
        .saturating_add(b.usage().map_or(0, |u| alloc_size(u.stream.capacity())))
        .saturating_add(book)
}

/// MEMORY USAGE of a window: the boxed struct and its bucket storage, two arrays of the same
/// capacity (4-byte offsets; 4- or 8-byte counts, see [`Window::allocations`]), each one
/// allocation, plus a configured key's boxed configuration and the remembered ids of
/// multi-key reservations (their queue, table and long ids,
/// [`crate::core::remembered::Remembered::allocations`]), each rounded up to its size class.
pub fn window_bytes(w: &Window) -> usize {
    let (offsets, counts) = w.allocations();
    let (extras, (queue, table, long_ids)) = w.extras_allocations(alloc_size);
    alloc_size(size_of::<Window>())
        .saturating_add(alloc_size(offsets))
        .saturating_add(alloc_size(counts))
        .saturating_add(alloc_size(extras))
        .saturating_add(queue)
        .saturating_add(alloc_size(table))
        .saturating_add(long_ids)
}
