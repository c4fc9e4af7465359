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
}
