//! The allocator's size classes: what a request of `n` bytes really takes in jemalloc, Redis's
//! default allocator. MEMORY USAGE rounds every allocation a value owns by it
//! (`crate::shell::memory`), and a growing queue fills the class it is given anyway
//! ([`crate::core::chunked`]).

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
