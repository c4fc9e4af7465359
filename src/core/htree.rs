//! A compact ordered set of `u32` handles whose order is defined outside the tree.
//!
//! The reservation book stores its entries once, in slabs addressed by `u32` handles, and orders
//! them three ways (by id, by deadline, by finish time). Each order is one of these trees: a
//! B-tree of handles only — 4 bytes per entry in 128-byte leaves — where every operation takes a
//! *probe*, `probe(h)` = how the sought key compares with the key of handle `h`. Keys are unique
//! and never stored here, so the tree costs about 5–8 bytes per entry instead of a copy of the
//! key.
//!
//! Every operation is O(log n) in the worst case: all leaves are at the same depth and every
//! node holds at least one item, so the height is at most log2(n + 1). Nodes split in the
//! middle, except that an insertion at the very end of the tree (deadlines, finish times and
//! generated ids mostly arrive in order) leaves the left node full, so append-mostly trees are
//! about 97 % full instead of half. Removals merge or rebalance nodes that fall below half.
//!
//! Iteration is in key order, from the start or from the first key not below a bound, without
//! allocating.
//!
//! A tree may also keep a [`Measure`] of its handles (the deadline index keeps the amount and
//! count of the reservations below each node): every inner node holds the measure of each
//! child's subtree, so the measure of all handles below a bound ([`HTree::sum_below`]) is one
//! descent, O(log n), instead of a walk over them — a B-tree augmented as Cormen et al.,
//! *Introduction to Algorithms*, ch. 14, augment red-black trees (order statistics). A plain
//! tree measures `()`: its sums never allocate (an inner node is 24 bytes larger, ~0.05 B per
//! entry) and computing them is free.

use std::cmp::Ordering;

/// Most items in a node: a leaf is then 1 + 31 × 4 = 125 → 128 bytes, one jemalloc size class.
const CAP: usize = 31;
/// Nodes below this many items are merged with or refilled from a sibling after a removal.
const MIN: usize = 15;
/// Deepest path an iterator can follow: the height is at most log2(2^32 + 1) < 34.
const MAX_DEPTH: usize = 34;

/// Up to [`CAP`] handles, in order.
#[derive(Clone, Debug)]
struct Items {
    len: u8,
    buf: [u32; CAP],
}

impl Items {
    fn new() -> Items {
        Items {
            len: 0,
            buf: [0; CAP],
        }
    }

    fn from_slice(items: &[u32]) -> Items {
        let mut out = Items::new();
        for &h in items.iter().take(CAP) {
            out.push(h);
        }
        out
    }

    fn len(&self) -> usize {
        usize::from(self.len)
    }

    fn as_slice(&self) -> &[u32] {
        self.buf.get(..self.len()).unwrap_or(&[])
    }

    fn get(&self, i: usize) -> Option<u32> {
        self.as_slice().get(i).copied()
    }

    fn set(&mut self, i: usize, h: u32) -> Option<u32> {
        let len = self.len();
        let slot = self.buf.get_mut(..len)?.get_mut(i)?;
        Some(std::mem::replace(slot, h))
    }

    /// Inserts at `pos` if there is room and `pos <= len`.
    fn insert(&mut self, pos: usize, h: u32) -> bool {
        let len = self.len();
        if len >= CAP || pos > len {
            return false;
        }
        let new_len = len.saturating_add(1);
        let Some(window) = self.buf.get_mut(pos..new_len) else {
            return false;
        };
        // A memmove (`rotate_right(1)` went through the general rotation: ~3x the instructions).
        let shifted = window.len().saturating_sub(1);
        window.copy_within(..shifted, 1);
        if let Some(first) = window.first_mut() {
            *first = h;
        }
        self.len = self.len.saturating_add(1);
        true
    }

    fn push(&mut self, h: u32) -> bool {
        self.insert(self.len(), h)
    }

    fn remove(&mut self, pos: usize) -> Option<u32> {
        let len = self.len();
        let window = self.buf.get_mut(pos..len)?;
        let h = *window.first()?;
        window.copy_within(1.., 0);
        self.len = self.len.saturating_sub(1);
        Some(h)
    }

    fn pop(&mut self) -> Option<u32> {
        let last = self.len().checked_sub(1)?;
        self.remove(last)
    }

    fn extend(&mut self, other: &[u32]) {
        for &h in other {
            self.push(h);
        }
    }
}

/// What a tree sums over its handles: a commutative group (sums must also subtract, so that a
/// removal updates the path above it without re-reading the subtree).
pub trait Measure: Copy + Default + PartialEq + std::fmt::Debug {
    fn plus(self, other: Self) -> Self;
    fn minus(self, other: Self) -> Self;
}

/// A plain tree: nothing is summed (`Vec<()>` never allocates).
impl Measure for () {
    fn plus(self, _: Self) -> Self {}
    fn minus(self, _: Self) -> Self {}
}

#[derive(Clone, Debug)]
struct Inner<M> {
    items: Items,
    /// `items.len() + 1` children.
    children: Vec<Node<M>>,
    /// The measure of each child's subtree (not of the items between them); as long as
    /// `children`.
    sums: Vec<M>,
}

#[derive(Clone, Debug)]
enum Node<M> {
    Leaf(Box<Items>),
    Inner(Box<Inner<M>>),
}

impl<M: Measure> Node<M> {
    fn items(&self) -> &Items {
        match self {
            Node::Leaf(items) => items,
            Node::Inner(inner) => &inner.items,
        }
    }

    fn items_mut(&mut self) -> &mut Items {
        match self {
            Node::Leaf(items) => items,
            Node::Inner(inner) => &mut inner.items,
        }
    }

    fn len(&self) -> usize {
        self.items().len()
    }
}

/// Where `probe`'s key goes among `items`: `Ok(i)` found at `i`, `Err(i)` before item `i`.
fn search(items: &[u32], probe: &impl Fn(u32) -> Ordering) -> Result<usize, usize> {
    items.binary_search_by(|&h| probe(h).reverse())
}

/// What an insertion below a node asks of it.
enum Ins<M> {
    /// The key is already there; nothing changed.
    Dup,
    Done,
    /// The node split: `separator` goes up, `right` is the new right sibling.
    Split(u32, Node<M>),
}

/// Node counts, for memory accounting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeCounts {
    pub leaves: usize,
    pub inner: usize,
}

/// Heap bytes of one leaf, for memory accounting.
pub const LEAF_BYTES: usize = std::mem::size_of::<Items>();

/// Adds `node` (whose subtree measures `sum`) at `pos`, growing the arrays by exactly one if
/// they are full: inner nodes of small trees then hold only the children they have.
fn insert_child<M: Measure>(inner: &mut Inner<M>, pos: usize, node: Node<M>, sum: M) {
    if inner.children.len() == inner.children.capacity() {
        inner.children.reserve_exact(1);
    }
    if inner.sums.len() == inner.sums.capacity() {
        inner.sums.reserve_exact(1);
    }
    inner.children.insert(pos.min(inner.children.len()), node);
    inner.sums.insert(pos.min(inner.sums.len()), sum);
}

/// The measure of the subtree at `node`, read from its items and its children's sums (one
/// node's worth of `measure` calls).
fn node_sum<M: Measure>(node: &Node<M>, measure: &impl Fn(u32) -> M) -> M {
    let items = items_sum(node, measure);
    match node {
        Node::Leaf(_) => items,
        Node::Inner(inner) => inner.sums.iter().fold(items, |acc, &s| acc.plus(s)),
    }
}

/// The measure of `node`'s own items (not of its children).
fn items_sum<M: Measure>(node: &Node<M>, measure: &impl Fn(u32) -> M) -> M {
    node.items()
        .as_slice()
        .iter()
        .fold(M::default(), |acc, &h| acc.plus(measure(h)))
}

/// Adds `delta` to the sum of child `i`.
fn add_to<M: Measure>(inner: &mut Inner<M>, i: usize, delta: M) {
    if let Some(s) = inner.sums.get_mut(i) {
        *s = s.plus(delta);
    }
}

/// Takes `delta` from the sum of child `i`.
fn take_from<M: Measure>(inner: &mut Inner<M>, i: usize, delta: M) {
    if let Some(s) = inner.sums.get_mut(i) {
        *s = s.minus(delta);
    }
}

/// Re-reads the sum of child `i` from the child (after it was split, merged or rotated).
fn resum<M: Measure>(inner: &mut Inner<M>, i: usize, measure: &impl Fn(u32) -> M) {
    let Some(sum) = inner.children.get(i).map(|c| node_sum(c, measure)) else {
        return;
    };
    if let Some(s) = inner.sums.get_mut(i) {
        *s = sum;
    }
}

/// The tree. See the module doc.
#[derive(Clone, Debug)]
pub struct HTree<M = ()> {
    root: Option<Node<M>>,
    len: usize,
    counts: NodeCounts,
}

impl<M> Default for HTree<M> {
    fn default() -> Self {
        HTree {
            root: None,
            len: 0,
            counts: NodeCounts::default(),
        }
    }
}

/// The plain tree's operations: those of the measured tree with nothing to measure.
impl HTree<()> {
    /// Inserts `h`, whose key `probe` describes. False (and nothing changed) if the key is
    /// already present.
    pub fn insert(&mut self, h: u32, probe: impl Fn(u32) -> Ordering) -> bool {
        self.insert_measured(h, probe, &|_| ())
    }

    /// [`HTree::insert`] of a key the caller knows to be above every key when `above`, as
    /// [`HTree::insert_measured_above`].
    pub fn insert_above(&mut self, h: u32, probe: impl Fn(u32) -> Ordering, above: bool) -> bool {
        self.insert_measured_above(h, probe, &|_| (), above)
    }

    /// Removes the handle whose key `probe` matches and returns it.
    pub fn remove(&mut self, probe: impl Fn(u32) -> Ordering) -> Option<u32> {
        self.remove_measured(probe, &|_| ())
    }

    /// Finds the handle whose key `probe` matches and removes it if `remove(handle)` says so,
    /// in one search (the decision is taken before anything changes).
    pub fn remove_if(
        &mut self,
        probe: impl Fn(u32) -> Ordering,
        remove: impl FnOnce(u32) -> bool,
    ) -> Found {
        self.remove_if_measured(probe, remove, &|_| ())
    }
}

impl<M: Measure> HTree<M> {
    /// Heap bytes of one inner node (without its arrays), for memory accounting.
    pub const INNER_BYTES: usize = std::mem::size_of::<Inner<M>>();

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn node_counts(&self) -> NodeCounts {
        self.counts
    }

    /// The handle whose key `probe` matches.
    pub fn find(&self, probe: impl Fn(u32) -> Ordering) -> Option<u32> {
        let mut node = self.root.as_ref()?;
        loop {
            match node {
                Node::Leaf(items) => {
                    return search(items.as_slice(), &probe)
                        .ok()
                        .and_then(|i| items.get(i))
                }
                Node::Inner(inner) => match search(inner.items.as_slice(), &probe) {
                    Ok(i) => return inner.items.get(i),
                    Err(i) => node = inner.children.get(i)?,
                },
            }
        }
    }

    /// Is `probe`'s key above every key (or the tree empty)? One comparison, with the last:
    /// how a new generated id is known to be absent without a search.
    pub fn is_above_last(&self, probe: impl Fn(u32) -> Ordering) -> bool {
        self.last()
            .is_none_or(|last| probe(last) == Ordering::Greater)
    }

    /// Where an insertion at the end (a generated id, a later deadline) starts: the root
    /// node's address and size, without reading the node. For prefetching: see
    /// [`crate::core::ledger::Budget::hot_addresses`].
    pub fn root_addresses(&self, out: &mut impl FnMut(*const u8, usize)) {
        match &self.root {
            None => {}
            Some(Node::Leaf(items)) => out(std::ptr::from_ref::<Items>(items).cast(), LEAF_BYTES),
            Some(Node::Inner(inner)) => {
                out(
                    std::ptr::from_ref::<Inner<M>>(inner).cast(),
                    std::mem::size_of::<Inner<M>>(),
                );
            }
        }
    }

    /// The first handle in order.
    pub fn first(&self) -> Option<u32> {
        let mut node = self.root.as_ref()?;
        loop {
            match node {
                Node::Leaf(items) => return items.get(0),
                Node::Inner(inner) => node = inner.children.first()?,
            }
        }
    }

    /// The last handle in order.
    pub fn last(&self) -> Option<u32> {
        last_of(self.root.as_ref()?)
    }

    /// Inserts `h`, whose key `probe` describes and whose measure is `measure(h)` (as for
    /// every handle: the sums above it are kept with it). False (and nothing changed) if the
    /// key is already present.
    pub fn insert_measured(
        &mut self,
        h: u32,
        probe: impl Fn(u32) -> Ordering,
        measure: &impl Fn(u32) -> M,
    ) -> bool {
        self.insert_measured_above(h, probe, measure, false)
    }

    /// [`HTree::insert_measured`]; `above`: the caller knows the key is above every key of the
    /// tree (from a bound it keeps), so it is appended without reading the last key (a walk
    /// down to the tree's last leaf and the entry it names: cache misses in a large tree).
    /// `false` finds out as `insert_measured` does.
    pub fn insert_measured_above(
        &mut self,
        h: u32,
        probe: impl Fn(u32) -> Ordering,
        measure: &impl Fn(u32) -> M,
        above: bool,
    ) -> bool {
        let Some(mut root) = self.root.take() else {
            let mut items = Items::new();
            items.push(h);
            self.root = Some(Node::Leaf(Box::new(items)));
            self.len = 1;
            self.counts.leaves = 1;
            return true;
        };
        // Keys mostly arrive in order (generated ids, deadlines, finish times): one comparison
        // with the last key then replaces a binary search at every level.
        debug_assert!(
            !above || last_of(&root).is_none_or(|last| probe(last) == Ordering::Greater),
            "a key said to be above every key is not"
        );
        let append = above || last_of(&root).is_some_and(|last| probe(last) == Ordering::Greater);
        let result = insert_rec(
            &mut root,
            h,
            &probe,
            measure,
            true,
            append,
            &mut self.counts,
        );
        match result {
            Ins::Dup => {
                self.root = Some(root);
                return false;
            }
            Ins::Done => self.root = Some(root),
            Ins::Split(separator, right) => {
                let mut items = Items::new();
                items.push(separator);
                let sums = vec![node_sum(&root, measure), node_sum(&right, measure)];
                let children = vec![root, right];
                self.root = Some(Node::Inner(Box::new(Inner {
                    items,
                    children,
                    sums,
                })));
                self.counts.inner = self.counts.inner.saturating_add(1);
            }
        }
        self.len = self.len.saturating_add(1);
        true
    }

    /// Removes the handle whose key `probe` matches and returns it. `measure` must still give
    /// each handle's measure as inserted.
    pub fn remove_measured(
        &mut self,
        probe: impl Fn(u32) -> Ordering,
        measure: &impl Fn(u32) -> M,
    ) -> Option<u32> {
        match self.remove_if_measured(probe, |_| true, measure) {
            Found::Removed(h) => Some(h),
            Found::Kept(_) | Found::Absent => None,
        }
    }

    /// Finds the handle whose key `probe` matches and removes it if `remove(handle)` says so,
    /// in one search (the decision is taken before anything changes).
    pub fn remove_if_measured(
        &mut self,
        probe: impl Fn(u32) -> Ordering,
        remove: impl FnOnce(u32) -> bool,
        measure: &impl Fn(u32) -> M,
    ) -> Found {
        let Some(root) = self.root.as_mut() else {
            return Found::Absent;
        };
        let mut remove = Some(remove);
        let mut kept = None;
        let mut decide = |h: u32| {
            let yes = remove.take().is_some_and(|f| f(h));
            if !yes {
                kept = Some(h);
            }
            yes
        };
        let Some(removed) = remove_rec(root, &probe, &mut decide, measure, &mut self.counts) else {
            return kept.map_or(Found::Absent, Found::Kept);
        };
        self.len = self.len.saturating_sub(1);
        // A root left without items gives way to its only child (or to nothing).
        if root.len() == 0 {
            match self.root.take() {
                Some(Node::Inner(mut inner)) => {
                    self.root = inner.children.pop();
                    self.counts.inner = self.counts.inner.saturating_sub(1);
                }
                Some(Node::Leaf(_)) | None => {
                    self.counts.leaves = self.counts.leaves.saturating_sub(1);
                }
            }
        }
        Found::Removed(removed)
    }

    /// Replaces the handle whose key `probe` matches with `h` (same key and measure, new
    /// handle). Never calls a measure, so `h`'s slot may still be empty (slab compaction
    /// repoints before it moves the entry).
    pub fn replace(&mut self, probe: impl Fn(u32) -> Ordering, h: u32) -> Option<u32> {
        let mut node = self.root.as_mut()?;
        loop {
            match node {
                Node::Leaf(items) => {
                    let i = search(items.as_slice(), &probe).ok()?;
                    return items.set(i, h);
                }
                Node::Inner(inner) => match search(inner.items.as_slice(), &probe) {
                    Ok(i) => return inner.items.set(i, h),
                    Err(i) => node = inner.children.get_mut(i)?,
                },
            }
        }
    }

    /// All handles in order.
    pub fn iter(&self) -> Iter<'_, M> {
        self.iter_from(|_| Ordering::Less)
    }

    /// Handles in order from the first whose key is not below `probe`'s (a `probe` that never
    /// answers `Equal` gives the first key above a bound).
    pub fn iter_from(&self, probe: impl Fn(u32) -> Ordering) -> Iter<'_, M> {
        let mut it = Iter {
            stack: [None; MAX_DEPTH],
            depth: 0,
        };
        let mut node = self.root.as_ref();
        while let Some(n) = node {
            let pos = match search(n.items().as_slice(), &probe) {
                Ok(i) | Err(i) => i,
            };
            if !it.push(n, pos) {
                break;
            }
            node = match n {
                Node::Leaf(_) => None,
                Node::Inner(inner) => inner.children.get(pos),
            };
        }
        it.settle();
        it
    }

    /// The measure of the handles whose key is below `probe`'s (`probe(h)` is `Greater` for
    /// them; a key that `probe` matches is not below). One descent: the sums of the children
    /// wholly below, and `measure` of the items below, at each level — O(log n) nodes.
    pub fn sum_below(&self, probe: impl Fn(u32) -> Ordering, measure: &impl Fn(u32) -> M) -> M {
        let mut acc = M::default();
        let mut node = self.root.as_ref();
        while let Some(n) = node {
            let (below, found) = match search(n.items().as_slice(), &probe) {
                Ok(i) => (i, true),
                Err(i) => (i, false),
            };
            let items = n.items().as_slice().get(..below).unwrap_or(&[]);
            acc = items.iter().fold(acc, |a, &h| a.plus(measure(h)));
            node = match n {
                Node::Leaf(_) => None,
                Node::Inner(inner) => {
                    // Children 0..below are wholly below; with a match, so is child `below`.
                    let whole = if found {
                        below.saturating_add(1)
                    } else {
                        below
                    };
                    let sums = inner.sums.get(..whole).unwrap_or(&inner.sums);
                    acc = sums.iter().fold(acc, |a, &s| a.plus(s));
                    if found {
                        None
                    } else {
                        inner.children.get(below)
                    }
                }
            };
        }
        acc
    }

    /// Calls `f(requested bytes, count)` for the tree's heap allocations.
    pub fn allocations(&self, f: &mut impl FnMut(usize, usize)) {
        f(LEAF_BYTES, self.counts.leaves);
        f(Self::INNER_BYTES, self.counts.inner);
        if let Some(root) = &self.root {
            inner_allocations(root, f);
        }
    }

    /// Checks the structure (order through `cmp`, counts, depth); for tests.
    pub fn check(&self, cmp: impl Fn(u32, u32) -> Ordering) -> Result<(), &'static str> {
        let items: Vec<u32> = self.iter().collect();
        if items.len() != self.len {
            return Err("length");
        }
        if items
            .windows(2)
            .any(|w| matches!(w, [a, b] if cmp(*a, *b) != Ordering::Less))
        {
            return Err("order");
        }
        let mut counts = NodeCounts::default();
        let mut leaf_depth = None;
        if let Some(root) = &self.root {
            check_node(root, 0, &mut leaf_depth, &mut counts)?;
        }
        if counts != self.counts {
            return Err("node counts");
        }
        Ok(())
    }

    /// Checks every inner node's sums against its children, re-read through `measure`; for
    /// tests ([`crate::core::book::Book::check`]).
    pub fn check_sums(&self, measure: &impl Fn(u32) -> M) -> Result<(), &'static str> {
        match &self.root {
            Some(root) => check_sums_of(root, measure).map(|_| ()),
            None => Ok(()),
        }
    }
}

/// The measure of the subtree at `node`, checking the sums kept on the way.
fn check_sums_of<M: Measure>(
    node: &Node<M>,
    measure: &impl Fn(u32) -> M,
) -> Result<M, &'static str> {
    let items = items_sum(node, measure);
    match node {
        Node::Leaf(_) => Ok(items),
        Node::Inner(inner) => {
            if inner.sums.len() != inner.children.len() {
                return Err("sums count");
            }
            let mut total = items;
            for (child, &kept) in inner.children.iter().zip(&inner.sums) {
                let sum = check_sums_of(child, measure)?;
                if sum != kept {
                    return Err("subtree sum");
                }
                total = total.plus(sum);
            }
            Ok(total)
        }
    }
}

fn inner_allocations<M: Measure>(node: &Node<M>, f: &mut impl FnMut(usize, usize)) {
    if let Node::Inner(inner) = node {
        f(
            inner
                .children
                .capacity()
                .saturating_mul(std::mem::size_of::<Node<M>>()),
            1,
        );
        // A plain tree's `Vec<()>` allocates nothing.
        if std::mem::size_of::<M>() > 0 {
            f(
                inner
                    .sums
                    .capacity()
                    .saturating_mul(std::mem::size_of::<M>()),
                1,
            );
        }
        for child in &inner.children {
            inner_allocations(child, f);
        }
    }
}

fn check_node<M: Measure>(
    node: &Node<M>,
    depth: usize,
    leaf_depth: &mut Option<usize>,
    counts: &mut NodeCounts,
) -> Result<(), &'static str> {
    if node.len() == 0 {
        return Err("empty node");
    }
    match node {
        Node::Leaf(_) => {
            counts.leaves = counts.leaves.saturating_add(1);
            match leaf_depth {
                Some(d) if *d != depth => return Err("leaves at different depths"),
                _ => *leaf_depth = Some(depth),
            }
        }
        Node::Inner(inner) => {
            counts.inner = counts.inner.saturating_add(1);
            if inner.children.len() != inner.items.len().saturating_add(1) {
                return Err("children count");
            }
            for child in &inner.children {
                check_node(child, depth.saturating_add(1), leaf_depth, counts)?;
            }
        }
    }
    Ok(())
}

/// The last handle of the subtree at `node`.
fn last_of<M: Measure>(mut node: &Node<M>) -> Option<u32> {
    loop {
        match node {
            Node::Leaf(items) => return items.get(items.len().checked_sub(1)?),
            Node::Inner(inner) => node = inner.children.last()?,
        }
    }
}

/// Inserts into the subtree at `node`; `rightmost`: the node is the last at its depth;
/// `append`: the key is known to be above every key of the tree (so no search is needed).
fn insert_rec<M: Measure>(
    node: &mut Node<M>,
    h: u32,
    probe: &impl Fn(u32) -> Ordering,
    measure: &impl Fn(u32) -> M,
    rightmost: bool,
    append: bool,
    counts: &mut NodeCounts,
) -> Ins<M> {
    let find = |items: &Items| {
        if append {
            Err(items.len())
        } else {
            search(items.as_slice(), probe)
        }
    };
    match node {
        Node::Leaf(items) => {
            let Err(pos) = find(items) else {
                return Ins::Dup;
            };
            if items.insert(pos, h) {
                return Ins::Done;
            }
            let append = rightmost && pos == items.len();
            let (separator, right) = split_items(items, pos, h, append);
            counts.leaves = counts.leaves.saturating_add(1);
            Ins::Split(separator, Node::Leaf(Box::new(right)))
        }
        Node::Inner(inner) => {
            let Err(pos) = find(&inner.items) else {
                return Ins::Dup;
            };
            let child_rightmost = rightmost && pos == inner.items.len();
            let Some(child) = inner.children.get_mut(pos) else {
                return Ins::Dup;
            };
            let (separator, right) =
                match insert_rec(child, h, probe, measure, child_rightmost, append, counts) {
                    Ins::Split(separator, right) => (separator, right),
                    Ins::Done => {
                        add_to(inner, pos, measure(h));
                        return Ins::Done;
                    }
                    Ins::Dup => return Ins::Dup,
                };
            // The child split: both halves are re-read (once per split, O(CAP) measures).
            resum(inner, pos, measure);
            let right_sum = node_sum(&right, measure);
            let child_pos = pos.saturating_add(1);
            if inner.items.insert(pos, separator) {
                insert_child(inner, child_pos, right, right_sum);
                return Ins::Done;
            }
            // Full: split the items as a leaf would, and the children and sums alongside.
            let append = child_rightmost;
            let (up, right_items) = split_items(&mut inner.items, pos, separator, append);
            insert_child(inner, child_pos, right, right_sum);
            let left_children = inner.items.len().saturating_add(1);
            // split_off: never panics, even if the two arrays ever differed in length.
            let right_children = inner
                .children
                .split_off(left_children.min(inner.children.len()));
            let right_sums = inner.sums.split_off(left_children.min(inner.sums.len()));
            inner.children.shrink_to_fit();
            inner.sums.shrink_to_fit();
            counts.inner = counts.inner.saturating_add(1);
            Ins::Split(
                up,
                Node::Inner(Box::new(Inner {
                    items: right_items,
                    children: right_children,
                    sums: right_sums,
                })),
            )
        }
    }
}

/// Splits full `items` plus `h` at `pos` (CAP + 1 handles): `items` keeps the left part, the
/// separator and the right part are returned. In the middle, or, for an append at the end of
/// the tree, leaving the left part full.
fn split_items(items: &mut Items, pos: usize, h: u32, append: bool) -> (u32, Items) {
    let mut all: Vec<u32> = Vec::with_capacity(CAP.saturating_add(1));
    let (before, after) = items.as_slice().split_at(pos.min(items.len()));
    all.extend_from_slice(before);
    all.push(h);
    all.extend_from_slice(after);
    let at = if append {
        all.len().saturating_sub(2)
    } else {
        all.len() / 2
    };
    let (left, rest) = all.split_at(at.min(all.len()));
    let (separator, right) = match rest.split_first() {
        Some((s, r)) => (*s, r),
        None => (h, &[][..]),
    };
    *items = Items::from_slice(left);
    (separator, Items::from_slice(right))
}

/// What [`HTree::remove_if`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    Removed(u32),
    /// Found, and left in place.
    Kept(u32),
    Absent,
}

/// Removes the key `probe` matches from the subtree at `node` if `decide(handle)` agrees;
/// nothing changes before it is asked.
fn remove_rec<M: Measure>(
    node: &mut Node<M>,
    probe: &impl Fn(u32) -> Ordering,
    decide: &mut impl FnMut(u32) -> bool,
    measure: &impl Fn(u32) -> M,
    counts: &mut NodeCounts,
) -> Option<u32> {
    match node {
        Node::Leaf(items) => {
            let i = search(items.as_slice(), probe).ok()?;
            if !decide(items.get(i)?) {
                return None;
            }
            items.remove(i)
        }
        Node::Inner(inner) => match search(inner.items.as_slice(), probe) {
            Ok(i) => {
                if !decide(inner.items.get(i)?) {
                    return None;
                }
                // Replaced by its predecessor, the largest key of the child before it.
                let pred = remove_max(inner.children.get_mut(i)?, measure, counts)?;
                take_from(inner, i, measure(pred));
                let removed = inner.items.set(i, pred);
                fix_child(inner, i, measure, counts);
                removed
            }
            Err(i) => {
                let removed =
                    remove_rec(inner.children.get_mut(i)?, probe, decide, measure, counts)?;
                take_from(inner, i, measure(removed));
                fix_child(inner, i, measure, counts);
                Some(removed)
            }
        },
    }
}

fn remove_max<M: Measure>(
    node: &mut Node<M>,
    measure: &impl Fn(u32) -> M,
    counts: &mut NodeCounts,
) -> Option<u32> {
    match node {
        Node::Leaf(items) => items.pop(),
        Node::Inner(inner) => {
            let last = inner.children.len().checked_sub(1)?;
            let removed = remove_max(inner.children.get_mut(last)?, measure, counts)?;
            take_from(inner, last, measure(removed));
            fix_child(inner, last, measure, counts);
            Some(removed)
        }
    }
}

/// After a removal below child `i`: refill it from a sibling or merge it with one if it fell
/// below [`MIN`]; the sums of the children that changed are re-read.
fn fix_child<M: Measure>(
    inner: &mut Inner<M>,
    i: usize,
    measure: &impl Fn(u32) -> M,
    counts: &mut NodeCounts,
) {
    let Some(child_len) = inner.children.get(i).map(Node::len) else {
        return;
    };
    if child_len >= MIN {
        return;
    }
    // The sibling pair (left index, right index), preferring the left sibling.
    let left = match i.checked_sub(1) {
        Some(l) => l,
        None if inner.children.len() > 1 => 0,
        None => return,
    };
    let right = left.saturating_add(1);
    let (Some(left_len), Some(right_len)) = (
        inner.children.get(left).map(Node::len),
        inner.children.get(right).map(Node::len),
    ) else {
        return;
    };
    if left_len.saturating_add(right_len) < CAP {
        merge(inner, left, counts);
        resum(inner, left, measure);
    } else {
        if left == i {
            rotate_left(inner, left);
        } else {
            rotate_right(inner, left);
        }
        resum(inner, left, measure);
        resum(inner, right, measure);
    }
}

/// Moves the separator between children `left` and `left + 1` down to the front of the right
/// child, and the left child's last item (and last child) up into its place.
fn rotate_right<M: Measure>(inner: &mut Inner<M>, left: usize) {
    let Some((l, r)) = pair(&mut inner.children, left) else {
        return;
    };
    let Some(up) = l.items_mut().pop() else {
        return;
    };
    let Some(down) = inner.items.set(left, up) else {
        l.items_mut().push(up);
        return;
    };
    r.items_mut().insert(0, down);
    if let (Node::Inner(li), Node::Inner(ri)) = (l, r) {
        if let Some(c) = li.children.pop() {
            let sum = li.sums.pop().unwrap_or_default();
            insert_child(ri, 0, c, sum);
        }
    }
}

/// Mirror of [`rotate_right`]: the right child's first item goes up, the separator down to the
/// end of the left child.
fn rotate_left<M: Measure>(inner: &mut Inner<M>, left: usize) {
    let Some((l, r)) = pair(&mut inner.children, left) else {
        return;
    };
    let Some(up) = r.items_mut().remove(0) else {
        return;
    };
    let Some(down) = inner.items.set(left, up) else {
        r.items_mut().insert(0, up);
        return;
    };
    l.items_mut().push(down);
    if let (Node::Inner(li), Node::Inner(ri)) = (l, r) {
        if !ri.children.is_empty() {
            let c = ri.children.remove(0);
            let sum = if ri.sums.is_empty() {
                M::default()
            } else {
                ri.sums.remove(0)
            };
            let end = li.children.len();
            insert_child(li, end, c, sum);
        }
    }
}

/// Merges child `left + 1` and the separator between them into child `left`.
fn merge<M: Measure>(inner: &mut Inner<M>, left: usize, counts: &mut NodeCounts) {
    let right_pos = left.saturating_add(1);
    if right_pos >= inner.children.len() || right_pos >= inner.sums.len() {
        return;
    }
    let Some(separator) = inner.items.remove(left) else {
        return;
    };
    let right = inner.children.remove(right_pos);
    // The caller re-reads the merged child's sum.
    inner.sums.remove(right_pos);
    let Some(l) = inner.children.get_mut(left) else {
        return;
    };
    l.items_mut().push(separator);
    l.items_mut().extend(right.items().as_slice());
    match (l, right) {
        (Node::Inner(li), Node::Inner(mut ri)) => {
            li.children.reserve_exact(ri.children.len());
            li.children.append(&mut ri.children);
            li.sums.reserve_exact(ri.sums.len());
            li.sums.append(&mut ri.sums);
            counts.inner = counts.inner.saturating_sub(1);
        }
        _ => counts.leaves = counts.leaves.saturating_sub(1),
    }
}

/// Mutable references to children `i` and `i + 1`.
fn pair<M>(children: &mut [Node<M>], i: usize) -> Option<(&mut Node<M>, &mut Node<M>)> {
    let (a, b) = children.split_at_mut_checked(i.checked_add(1)?)?;
    Some((a.last_mut()?, b.first_mut()?))
}

/// In-order iterator: a stack of (node, next item index).
pub struct Iter<'a, M = ()> {
    stack: [Option<(&'a Node<M>, usize)>; MAX_DEPTH],
    depth: usize,
}

impl<'a, M: Measure> Iter<'a, M> {
    fn push(&mut self, node: &'a Node<M>, pos: usize) -> bool {
        match self.stack.get_mut(self.depth) {
            Some(slot) => {
                *slot = Some((node, pos));
                self.depth = self.depth.saturating_add(1);
                true
            }
            None => false,
        }
    }

    fn top(&self) -> Option<(&'a Node<M>, usize)> {
        self.stack
            .get(self.depth.checked_sub(1)?)
            .copied()
            .flatten()
    }

    /// Pops exhausted nodes so that the top, if any, has an item to yield.
    fn settle(&mut self) {
        while let Some((node, pos)) = self.top() {
            if pos < node.len() {
                return;
            }
            self.depth = self.depth.saturating_sub(1);
        }
    }
}

impl<M: Measure> Iterator for Iter<'_, M> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        let (node, pos) = self.top()?;
        let h = node.items().get(pos)?;
        let next = pos.saturating_add(1);
        if let Some(slot) = self
            .depth
            .checked_sub(1)
            .and_then(|d| self.stack.get_mut(d))
        {
            *slot = Some((node, next));
        }
        // After item `pos` of an inner node comes the leftmost path of child `pos + 1`.
        let mut below = match node {
            Node::Inner(inner) => inner.children.get(next),
            Node::Leaf(_) => None,
        };
        while let Some(n) = below {
            if !self.push(n, 0) {
                break;
            }
            below = match n {
                Node::Inner(inner) => inner.children.first(),
                Node::Leaf(_) => None,
            };
        }
        self.settle();
        Some(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// A test measure: the sum of the keys and their count.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    struct KeySum(i64, u64);

    impl Measure for KeySum {
        fn plus(self, o: Self) -> Self {
            KeySum(self.0.wrapping_add(o.0), self.1.wrapping_add(o.1))
        }
        fn minus(self, o: Self) -> Self {
            KeySum(self.0.wrapping_sub(o.0), self.1.wrapping_sub(o.1))
        }
    }

    /// Handles whose key is `keys[h]`, in a plain tree and in a tree measuring [`KeySum`]
    /// (the same operations on both).
    struct Model {
        keys: Vec<i64>,
        tree: HTree,
        measured: HTree<KeySum>,
        set: BTreeSet<(i64, u32)>,
    }

    impl Model {
        fn new() -> Model {
            Model {
                keys: Vec::new(),
                tree: HTree::default(),
                measured: HTree::default(),
                set: BTreeSet::new(),
            }
        }

        /// A model holding keys `0..n`, inserted in order (appends), checked.
        fn appended(n: i64) -> Model {
            let mut m = Model::new();
            for i in 0..n {
                m.insert(i);
            }
            m.check();
            m
        }

        fn measure(&self) -> impl Fn(u32) -> KeySum + '_ {
            |h| KeySum(self.keys[h as usize], 1)
        }

        fn key(&self, h: u32) -> (i64, u32) {
            (self.keys[h as usize], h)
        }

        fn probe(&self, k: (i64, u32)) -> impl Fn(u32) -> Ordering + '_ {
            move |h| k.cmp(&self.key(h))
        }

        fn insert(&mut self, key: i64) {
            let h = self.keys.len() as u32;
            self.keys.push(key);
            let k = (key, h);
            let keys = &self.keys;
            assert!(self.tree.insert(h, |x| k.cmp(&(keys[x as usize], x))));
            let measure = |x: u32| KeySum(keys[x as usize], 1);
            assert!(self
                .measured
                .insert_measured(h, |x| k.cmp(&(keys[x as usize], x)), &measure));
            assert!(self.set.insert(k));
        }

        fn remove_nth(&mut self, n: usize) {
            if self.set.is_empty() {
                return;
            }
            let k = *self.set.iter().nth(n % self.set.len()).unwrap();
            let keys = &self.keys;
            // A declined removal finds the handle and changes nothing.
            let mut asked = None;
            let kept = self.tree.remove_if(
                |x| k.cmp(&(keys[x as usize], x)),
                |h| {
                    asked = Some(h);
                    false
                },
            );
            assert_eq!((kept, asked), (Found::Kept(k.1), Some(k.1)));
            assert_eq!(self.tree.len(), self.set.len());
            assert_eq!(
                self.tree.remove(|x| k.cmp(&(keys[x as usize], x))),
                Some(k.1)
            );
            let measure = |x: u32| KeySum(keys[x as usize], 1);
            assert_eq!(
                self.measured
                    .remove_measured(|x| k.cmp(&(keys[x as usize], x)), &measure),
                Some(k.1)
            );
            self.set.remove(&k);
        }

        fn check(&self) {
            let keys = &self.keys;
            self.tree
                .check(|a, b| (keys[a as usize], a).cmp(&(keys[b as usize], b)))
                .unwrap();
            let got: Vec<u32> = self.tree.iter().collect();
            let want: Vec<u32> = self.set.iter().map(|k| k.1).collect();
            assert_eq!(got, want);
            assert_eq!(self.tree.first(), want.first().copied());
            assert_eq!(self.tree.last(), want.last().copied());
            self.measured
                .check(|a, b| (keys[a as usize], a).cmp(&(keys[b as usize], b)))
                .unwrap();
            self.measured.check_sums(&self.measure()).unwrap();
            let got: Vec<u32> = self.measured.iter().collect();
            assert_eq!(got, want);
        }

        /// `sum_below` for the bound `(key, h)` against the set: strictly below a key that
        /// is held, and below a bound that matches nothing (every `key` with `h = u32::MAX`).
        fn check_sums_below(&self, key: i64, h: u32) {
            let keys = &self.keys;
            let k = (key, h);
            let want = self
                .set
                .range(..k)
                .fold(KeySum::default(), |a, &(key, _)| a.plus(KeySum(key, 1)));
            let got = self
                .measured
                .sum_below(|x| k.cmp(&(keys[x as usize], x)), &self.measure());
            assert_eq!(got, want, "below {k:?}");
        }
    }

    #[test]
    fn appends_fill_leaves() {
        let mut m = Model::appended(10_000);
        let c = m.tree.node_counts();
        // About 30 per leaf when appending in order.
        assert!(c.leaves <= 10_000 / 29, "{c:?}");
        for i in 0..9_990 {
            m.remove_nth(i % 7);
        }
        m.check();
        while !m.set.is_empty() {
            m.remove_nth(3);
        }
        m.check();
        assert_eq!(m.tree.node_counts(), NodeCounts::default());
        assert!(m.tree.root.is_none());
    }

    #[test]
    fn duplicates_are_refused_and_lookups_work() {
        let mut m = Model::new();
        for i in [5, 3, 9, 1, 7] {
            m.insert(i);
        }
        let keys = m.keys.clone();
        // Same key and handle again.
        assert!(!m
            .tree
            .insert(0, |x| (5i64, 0u32).cmp(&(keys[x as usize], x))));
        assert_eq!(m.tree.find(m.probe((9, 2))), Some(2));
        assert_eq!(m.tree.find(m.probe((9, 3))), None);
        let from: Vec<u32> = m.tree.iter_from(|x| 4i64.cmp(&keys[x as usize])).collect();
        assert_eq!(from, vec![0, 4, 2]);
        let probe = |x: u32| (7i64, 4u32).cmp(&(keys[x as usize], x));
        assert_eq!(m.tree.replace(probe, 4), Some(4));
        m.check();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn behaves_like_a_btreeset(ops in proptest::collection::vec((0u8..4, -50i64..50, 0usize..1000), 1..1500)) {
            let mut m = Model::new();
            for (op, key, n) in ops {
                match op {
                    0 | 1 => m.insert(key),
                    2 => m.insert(m.keys.len() as i64), // appends
                    _ => m.remove_nth(n),
                }
            }
            m.check();
            let keys = m.keys.clone();
            for k in m.set.clone() {
                prop_assert_eq!(m.tree.find(|x| k.cmp(&(keys[x as usize], x))), Some(k.1));
                let from: Vec<u32> = m.tree.iter_from(|x| k.cmp(&(keys[x as usize], x))).collect();
                let want: Vec<u32> = m.set.range(k..).map(|e| e.1).collect();
                prop_assert_eq!(from, want);
            }
            for k in m.set.clone() {
                m.check_sums_below(k.0, k.1);
                m.check_sums_below(k.0, u32::MAX);
            }
            m.check_sums_below(i64::MIN, 0);
            m.check_sums_below(i64::MAX, u32::MAX);
            while !m.set.is_empty() {
                m.remove_nth(7);
                if m.set.len() % 97 == 0 {
                    m.check();
                    m.check_sums_below(0, u32::MAX);
                }
            }
            m.check();
        }
    }

    #[test]
    fn sums_survive_removals_anywhere_in_a_deep_tree() {
        // 12 000 keys in a scrambled order: three levels, so removals of inner items take
        // predecessors up through inner nodes, and every rebalancing case happens.
        let mut m = Model::new();
        let n: i64 = 12_000;
        for i in 0..n {
            m.insert((i * 7_919) % n);
        }
        m.check();
        let mut step = 0usize;
        while !m.set.is_empty() {
            step += 1;
            m.remove_nth(step.wrapping_mul(2_654_435_761) % 65_536);
            if step % 1_000 == 0 {
                m.check();
                m.check_sums_below(n / 2, u32::MAX);
            }
        }
        m.check();
    }

    #[test]
    fn sums_below_follow_appends_and_removals_from_the_front() {
        // The deadline index's pattern: appends in order, expiry from the front.
        let mut m = Model::appended(5_000);
        for bound in [0, 1, 30, 31, 32, 961, 2_500, 4_999, 5_000] {
            m.check_sums_below(bound, u32::MAX);
        }
        // Below 2 500 (u32::MAX sorts after every handle of key 2 499): keys 0..=2 499.
        let keys = m.keys.clone();
        let below = m.measured.sum_below(
            |x| (2_499i64, u32::MAX).cmp(&(keys[x as usize], x)),
            &m.measure(),
        );
        assert_eq!(below, KeySum((0..2_500).sum(), 2_500));
        for _ in 0..4_000 {
            m.remove_nth(0);
        }
        m.check();
        for bound in [0, 4_000, 4_500, 5_000] {
            m.check_sums_below(bound, u32::MAX);
        }
    }
}
