//! A FIFO queue stored in fixed-size chunks (the remembered ids of a window key,
//! [`crate::core::remembered`]): elements arrive at the back and leave at the front, and are
//! read by position.
//!
//! A busy window key remembers thousands of ids. In one contiguous `VecDeque` each growth
//! copies every id into a new, untouched allocation (page faults on the command path: about 2 %
//! of a 5-key `QUOTA.MRESERVE` while a window fills, docs/benchmarks.md). Here a queue of more
//! than `C` elements is a sequence of chunks of exactly `C` slots: the back gets a new chunk when
//! its last one is full, the front frees a chunk once it has been emptied (the allocator hands
//! that memory to the next new chunk), and nothing is ever copied. A queue of at most `C`
//! elements is one chunk grown by a quarter at a time, so a quiet key stays small.
//!
//! Layout invariant: every chunk but the first and the last holds exactly `C` elements, so
//! position `i` is found by one division and the length from the two end chunks (no field for
//! it: the struct is 32 bytes, as a `VecDeque`'s, and so is a window key's boxed extras).

use std::collections::VecDeque;

use crate::core::size_class::alloc_size;

/// A FIFO queue in chunks of `C` slots (see the module doc).
#[derive(Clone)]
pub struct ChunkedQueue<T, const C: usize> {
    /// Oldest first. Never holds an empty chunk while it holds another.
    chunks: VecDeque<VecDeque<T>>,
}

impl<T, const C: usize> Default for ChunkedQueue<T, C> {
    fn default() -> Self {
        Self::new()
    }
}

/// The capacity a full single chunk of `len` slots of `T` grows to: by a quarter (at least 4;
/// amortised 4 moves per element, and at most `C` slots are ever moved), then up to what the
/// allocator's size class of those bytes holds anyway ([`alloc_size`]), at most `cap`.
pub fn grown_capacity<T>(len: usize, cap: usize) -> usize {
    let size = std::mem::size_of::<T>().max(1);
    let want = len.saturating_add((len / 4).max(4));
    let filled = alloc_size(want.saturating_mul(size))
        .checked_div(size)
        .unwrap_or(want)
        .max(want);
    filled.min(cap).max(len.saturating_add(1))
}

impl<T, const C: usize> ChunkedQueue<T, C> {
    /// An empty queue (no heap).
    pub const fn new() -> Self {
        ChunkedQueue {
            chunks: VecDeque::new(),
        }
    }

    /// How many elements it holds: the end chunks' and `C` per chunk between them.
    pub fn len(&self) -> usize {
        match (self.chunks.front(), self.chunks.back()) {
            (Some(first), Some(last)) if self.chunks.len() > 1 => first
                .len()
                .saturating_add(last.len())
                .saturating_add(self.chunks.len().saturating_sub(2).saturating_mul(C)),
            (Some(only), _) => only.len(),
            _ => 0,
        }
    }

    /// True if it holds none.
    pub fn is_empty(&self) -> bool {
        self.chunks.front().is_none_or(VecDeque::is_empty)
    }

    /// The chunk and offset of position `i` (`None` past the end).
    fn locate(&self, i: usize) -> Option<(usize, usize)> {
        if i >= self.len() {
            return None;
        }
        let first = self.chunks.front().map_or(0, VecDeque::len);
        match i.checked_sub(first) {
            None => Some((0, i)),
            // `C` is never 0 (a chunk holds at least one slot): `None` only then.
            Some(j) => Some((j.checked_div(C)?.saturating_add(1), j.checked_rem(C)?)),
        }
    }

    /// The element at position `i` (0 is the oldest).
    pub fn get(&self, i: usize) -> Option<&T> {
        let (c, o) = self.locate(i)?;
        self.chunks.get(c)?.get(o)
    }

    /// The element at position `i`, mutably.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        let (c, o) = self.locate(i)?;
        self.chunks.get_mut(c)?.get_mut(o)
    }

    /// The oldest element.
    pub fn front(&self) -> Option<&T> {
        self.chunks.front()?.front()
    }

    /// The newest element.
    pub fn back(&self) -> Option<&T> {
        self.chunks.back()?.back()
    }

    /// Appends `value` as the newest element: into the last chunk while it has room, else a
    /// new chunk of `C` slots (a single chunk below `C` slots grows instead).
    pub fn push_back(&mut self, value: T) {
        match self.chunks.back_mut() {
            Some(last) if last.len() < C => {
                if last.len() == last.capacity() {
                    let len = last.len();
                    last.reserve_exact(grown_capacity::<T>(len, C).saturating_sub(len));
                }
                last.push_back(value);
            }
            Some(_) => {
                let mut chunk = VecDeque::with_capacity(C);
                chunk.push_back(value);
                self.chunks.push_back(chunk);
            }
            None => {
                let mut chunk = VecDeque::with_capacity(grown_capacity::<T>(0, C));
                chunk.push_back(value);
                self.chunks.push_back(chunk);
            }
        }
    }

    /// Removes and returns the oldest element; a first chunk it empties is freed unless it is
    /// the only one.
    pub fn pop_front(&mut self) -> Option<T> {
        let first = self.chunks.front_mut()?;
        let value = first.pop_front()?;
        if first.is_empty() && self.chunks.len() > 1 {
            self.chunks.pop_front();
        }
        Some(value)
    }

    /// Slots allocated, in every chunk.
    pub fn capacity(&self) -> usize {
        self.chunks
            .iter()
            .map(VecDeque::capacity)
            .fold(0usize, usize::saturating_add)
    }

    /// Gives back spare memory once the queue has shrunk: a single chunk with more than half
    /// its length spare (and 16 slots) is cut to an eighth above its length, and the table of
    /// chunks with more than twice their number to half above it. A queue of several chunks
    /// has at most the unused ends of its first and last chunk spare.
    pub fn shrink(&mut self) {
        if let (1, Some(only)) = (self.chunks.len(), self.chunks.front_mut()) {
            let len = only.len();
            if only.capacity() > len.saturating_add(len / 2).saturating_add(16) {
                only.shrink_to(len.saturating_add(len / 8));
            }
        }
        let n = self.chunks.len();
        if self.chunks.capacity() > n.saturating_mul(2).saturating_add(4) {
            self.chunks.shrink_to(n.saturating_add(n / 2));
        }
    }

    /// The number of elements before the first one for which `pred` is false, if `pred` is
    /// true for a prefix (as `slice::partition_point`). O(log n).
    pub fn partition_point(&self, mut pred: impl FnMut(&T) -> bool) -> usize {
        let (mut lo, mut hi) = (0usize, self.len());
        while lo < hi {
            let mid = lo.saturating_add(hi.saturating_sub(lo) / 2);
            match self.get(mid) {
                Some(e) if pred(e) => lo = mid.saturating_add(1),
                _ => hi = mid,
            }
        }
        lo
    }

    /// The elements, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.chunks.iter().flatten()
    }

    /// The elements from position `from` on, oldest first.
    pub fn iter_from(&self, from: usize) -> impl Iterator<Item = &T> + '_ {
        let (c, o) = self.locate(from).unwrap_or((self.chunks.len(), 0));
        self.chunks
            .range(c.min(self.chunks.len())..)
            .enumerate()
            .flat_map(move |(k, chunk)| chunk.range(if k == 0 { o } else { 0 }..))
    }

    /// The elements, mutably, oldest first.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> + '_ {
        self.chunks.iter_mut().flatten()
    }

    /// Takes every element out, oldest first, leaving the queue empty (and without heap).
    pub fn take_all(&mut self) -> Vec<T> {
        let chunks = std::mem::take(&mut self.chunks);
        let mut all = Vec::with_capacity(chunks.iter().map(VecDeque::len).sum());
        for chunk in chunks {
            all.extend(chunk);
        }
        all
    }

    /// Calls `out(bytes)` for each heap allocation: the table of chunks, then each chunk.
    pub fn allocations(&self, mut out: impl FnMut(usize)) {
        if self.chunks.capacity() > 0 {
            out(self
                .chunks
                .capacity()
                .saturating_mul(std::mem::size_of::<VecDeque<T>>()));
        }
        for chunk in &self.chunks {
            if chunk.capacity() > 0 {
                out(chunk.capacity().saturating_mul(std::mem::size_of::<T>()));
            }
        }
    }

    /// Calls `out(address, bytes)` for the two oldest elements (the one that leaves and the
    /// one read to see whether it leaves too) and for the newest with the slot after it (where
    /// the next one is written, unless its chunk is full or wraps). Addresses only, for
    /// prefetching: they may lie past an allocation.
    pub fn hot_addresses(&self, out: &mut impl FnMut(*const u8, usize)) {
        let two = std::mem::size_of::<T>().saturating_mul(2);
        for e in [self.front(), self.back()].into_iter().flatten() {
            out(std::ptr::from_ref::<T>(e).cast(), two);
        }
    }
}

impl<T, const C: usize> From<Vec<T>> for ChunkedQueue<T, C> {
    /// The elements of `all` in their order: one chunk of exactly their number if they fit
    /// in one, else chunks of `C`.
    fn from(all: Vec<T>) -> Self {
        let len = all.len();
        if len <= C {
            let chunks = if len == 0 {
                VecDeque::new()
            } else {
                VecDeque::from([VecDeque::from(all)])
            };
            return ChunkedQueue { chunks };
        }
        let mut q = ChunkedQueue::new();
        q.chunks.reserve_exact(len.div_ceil(C));
        for value in all {
            q.push_back(value);
        }
        q
    }
}

impl<T: PartialEq, const C: usize> PartialEq for ChunkedQueue<T, C> {
    /// The same elements in the same order (however they are chunked).
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<T: Eq, const C: usize> Eq for ChunkedQueue<T, C> {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Q = ChunkedQueue<u32, 8>;

    /// Every chunk but the first and last is full, none is empty unless it is the only one,
    /// and the length is their sum.
    fn check_layout(q: &Q) {
        let n = q.chunks.len();
        for (k, c) in q.chunks.iter().enumerate() {
            assert!(c.len() <= 8);
            if k > 0 && k + 1 < n {
                assert_eq!(c.len(), 8, "middle chunk {k} of {n}");
            }
            if n > 1 {
                assert!(!c.is_empty(), "empty chunk {k} of {n}");
            }
        }
        assert_eq!(q.len(), q.chunks.iter().map(VecDeque::len).sum::<usize>());
        assert_eq!(q.is_empty(), q.iter().next().is_none());
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// A step of 0 to 2 above the newest value.
        Push(u8),
        Pop,
        Shrink,
        Rebuild,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u8..3).prop_map(Op::Push),
            4 => Just(Op::Pop),
            1 => Just(Op::Shrink),
            1 => Just(Op::Rebuild),
        ]
    }

    proptest! {
        /// Against a `VecDeque`: the same elements at every position, the same ends, the
        /// same partition points and suffixes, after any pushes, pops, shrinks and rebuilds.
        #[test]
        fn behaves_as_a_vecdeque(ops in proptest::collection::vec(op(), 0..400)) {
            let mut q = Q::new();
            let mut model: VecDeque<u32> = VecDeque::new();
            let mut next = 0u32;
            for op in ops {
                match op {
                    Op::Push(step) => {
                        // Nondecreasing, as the remembered ids' bucket indexes.
                        next += u32::from(step);
                        q.push_back(next);
                        model.push_back(next);
                    }
                    Op::Pop => prop_assert_eq!(q.pop_front(), model.pop_front()),
                    Op::Shrink => q.shrink(),
                    Op::Rebuild => q = Q::from(q.take_all()),
                }
                check_layout(&q);
                prop_assert_eq!(q.len(), model.len());
                prop_assert_eq!(q.front(), model.front());
                prop_assert_eq!(q.back(), model.back());
                prop_assert!(q.capacity() >= q.len());
                for i in 0..=model.len() {
                    prop_assert_eq!(q.get(i), model.get(i));
                    let from: Vec<u32> = q.iter_from(i).copied().collect();
                    let want: Vec<u32> = model.range(i..).copied().collect();
                    prop_assert_eq!(from, want);
                }
                let all: Vec<u32> = q.iter().copied().collect();
                prop_assert_eq!(&all, &Vec::from(model.clone()));
                for v in [0, next / 2, next, next + 1] {
                    prop_assert_eq!(
                        q.partition_point(|&x| x < v),
                        model.partition_point(|&x| x < v)
                    );
                }
            }
            if let Some(mid) = model.len().checked_sub(1) {
                *q.get_mut(mid).unwrap() = 7;
                model[mid] = 7;
            }
            for (a, b) in q.iter_mut().zip(model.iter()) {
                prop_assert_eq!(*a, *b);
            }
        }
    }

    /// A queue up to one chunk long is one chunk grown by a quarter; past it, chunks of
    /// exactly `C` slots that are never moved; popping frees emptied chunks.
    #[test]
    fn grows_in_place_then_in_chunks() {
        let mut q: ChunkedQueue<u64, 64> = ChunkedQueue::new();
        q.push_back(0);
        assert_eq!(q.capacity(), 4);
        for i in 1..64 {
            q.push_back(i);
        }
        assert_eq!((q.chunks.len(), q.capacity()), (1, 64));
        let first: *const u64 = q.get(0).unwrap();
        for i in 64..1000 {
            q.push_back(i);
        }
        assert_eq!(q.chunks.len(), 16);
        assert_eq!(q.capacity(), 16 * 64);
        assert!(std::ptr::eq(first, q.get(0).unwrap()), "never moved");
        for i in 0..640 {
            assert_eq!(q.pop_front(), Some(i));
        }
        assert_eq!(q.chunks.len(), 6);
        assert_eq!(q.get(0), Some(&640));
        let mut bytes = Vec::new();
        q.allocations(|b| bytes.push(b));
        assert_eq!(bytes.len(), 7);
        assert!(bytes[1..].iter().all(|&b| b == 64 * 8));
    }

    /// The grown capacity takes at least a quarter more (at least one more at the cap) and
    /// never passes the cap.
    #[test]
    fn growth_is_bounded_by_the_chunk() {
        for len in 0..64 {
            let cap = grown_capacity::<[u8; 40]>(len, 64);
            assert!(cap > len && cap <= 64, "{len}: {cap}");
            assert!(cap >= (len + (len / 4).max(4)).min(64), "{len}: {cap}");
        }
    }
}
