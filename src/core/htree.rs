//! A compact ordered set of `u32` handles whose order is defined outside the tree.
//!
//! The reservation book stores its entries once, in slabs addressed by `u32` handles, and orders
//! them three ways (by id, by deadline, by finish time). Each order is one of these trees: a
//! B-tree of handles only — 4 bytes per entry in 128-byte leaves — where every operation takes a
//! *probe*, `probe(h)` = how the sought key compares with the key of handle `h`. Keys are unique
//! and never stored here, so the tree costs about 4.5–6 bytes per entry instead of a copy of the
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
        window.rotate_right(1);
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
        window.rotate_left(1);
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

#[derive(Clone, Debug)]
struct Inner {
    items: Items,
    /// `items.len() + 1` children.
    children: Vec<Node>,
}

#[derive(Clone, Debug)]
enum Node {
    Leaf(Box<Items>),
    Inner(Box<Inner>),
}

impl Node {
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
enum Ins {
    /// The key is already there; nothing changed.
    Dup,
    Done,
    /// The node split: `separator` goes up, `right` is the new right sibling.
    Split(u32, Node),
}

/// Node counts, for memory accounting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeCounts {
    pub leaves: usize,
    pub inner: usize,
}

/// Heap bytes of one leaf and of one inner node (without its child array), for memory
/// accounting.
pub const LEAF_BYTES: usize = std::mem::size_of::<Items>();
pub const INNER_BYTES: usize = std::mem::size_of::<Inner>();

/// Adds `node` to `children` at `pos`, growing the array by exactly one if it is full: inner
/// nodes of small trees then hold only the children they have.
fn insert_child(children: &mut Vec<Node>, pos: usize, node: Node) {
    if children.len() == children.capacity() {
        children.reserve_exact(1);
    }
    children.insert(pos.min(children.len()), node);
}

/// The tree. See the module doc.
#[derive(Clone, Debug, Default)]
pub struct HTree {
    root: Option<Node>,
    len: usize,
    counts: NodeCounts,
}

impl HTree {
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

    /// Inserts `h`, whose key `probe` describes. False (and nothing changed) if the key is
    /// already present.
    pub fn insert(&mut self, h: u32, probe: impl Fn(u32) -> Ordering) -> bool {
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
        let append = last_of(&root).is_some_and(|last| probe(last) == Ordering::Greater);
        let result = insert_rec(&mut root, h, &probe, true, append, &mut self.counts);
        match result {
            Ins::Dup => {
                self.root = Some(root);
                return false;
            }
            Ins::Done => self.root = Some(root),
            Ins::Split(separator, right) => {
                let mut items = Items::new();
                items.push(separator);
                let children = vec![root, right];
                self.root = Some(Node::Inner(Box::new(Inner { items, children })));
                self.counts.inner = self.counts.inner.saturating_add(1);
            }
        }
        self.len = self.len.saturating_add(1);
        true
    }

    /// Removes the handle whose key `probe` matches and returns it.
    pub fn remove(&mut self, probe: impl Fn(u32) -> Ordering) -> Option<u32> {
        match self.remove_if(probe, |_| true) {
            Found::Removed(h) => Some(h),
            Found::Kept(_) | Found::Absent => None,
        }
    }

    /// Finds the handle whose key `probe` matches and removes it if `remove(handle)` says so,
    /// in one search (the decision is taken before anything changes).
    pub fn remove_if(
        &mut self,
        probe: impl Fn(u32) -> Ordering,
        remove: impl FnOnce(u32) -> bool,
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
        let Some(removed) = remove_rec(root, &probe, &mut decide, &mut self.counts) else {
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

    /// Replaces the handle whose key `probe` matches with `h` (same key, new handle).
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
    pub fn iter(&self) -> Iter<'_> {
        self.iter_from(|_| Ordering::Less)
    }

    /// Handles in order from the first whose key is not below `probe`'s (a `probe` that never
    /// answers `Equal` gives the first key above a bound).
    pub fn iter_from(&self, probe: impl Fn(u32) -> Ordering) -> Iter<'_> {
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

    /// Calls `f(requested bytes, count)` for the tree's heap allocations.
    pub fn allocations(&self, f: &mut impl FnMut(usize, usize)) {
        f(LEAF_BYTES, self.counts.leaves);
        f(INNER_BYTES, self.counts.inner);
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
}

fn inner_allocations(node: &Node, f: &mut impl FnMut(usize, usize)) {
    if let Node::Inner(inner) = node {
        f(
            inner
                .children
                .capacity()
                .saturating_mul(std::mem::size_of::<Node>()),
            1,
        );
        for child in &inner.children {
            inner_allocations(child, f);
        }
    }
}

fn check_node(
    node: &Node,
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
fn last_of(mut node: &Node) -> Option<u32> {
    loop {
        match node {
            Node::Leaf(items) => return items.get(items.len().checked_sub(1)?),
            Node::Inner(inner) => node = inner.children.last()?,
        }
    }
}

/// Inserts into the subtree at `node`; `rightmost`: the node is the last at its depth;
/// `append`: the key is known to be above every key of the tree (so no search is needed).
fn insert_rec(
    node: &mut Node,
    h: u32,
    probe: &impl Fn(u32) -> Ordering,
    rightmost: bool,
    append: bool,
    counts: &mut NodeCounts,
) -> Ins {
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
                match insert_rec(child, h, probe, child_rightmost, append, counts) {
                    Ins::Split(separator, right) => (separator, right),
                    other => return other,
                };
            let child_pos = pos.saturating_add(1);
            if inner.items.insert(pos, separator) {
                insert_child(&mut inner.children, child_pos, right);
                return Ins::Done;
            }
            // Full: split the items as a leaf would, and the children alongside.
            let append = child_rightmost;
            let (up, right_items) = split_items(&mut inner.items, pos, separator, append);
            insert_child(&mut inner.children, child_pos, right);
            let left_children = inner.items.len().saturating_add(1);
            let right_children: Vec<Node> = inner.children.drain(left_children..).collect();
            inner.children.shrink_to_fit();
            counts.inner = counts.inner.saturating_add(1);
            Ins::Split(
                up,
                Node::Inner(Box::new(Inner {
                    items: right_items,
                    children: right_children,
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
fn remove_rec(
    node: &mut Node,
    probe: &impl Fn(u32) -> Ordering,
    decide: &mut impl FnMut(u32) -> bool,
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
                let pred = remove_max(inner.children.get_mut(i)?, counts)?;
                let removed = inner.items.set(i, pred);
                fix_child(inner, i, counts);
                removed
            }
            Err(i) => {
                let removed = remove_rec(inner.children.get_mut(i)?, probe, decide, counts)?;
                fix_child(inner, i, counts);
                Some(removed)
            }
        },
    }
}

fn remove_max(node: &mut Node, counts: &mut NodeCounts) -> Option<u32> {
    match node {
        Node::Leaf(items) => items.pop(),
        Node::Inner(inner) => {
            let last = inner.children.len().checked_sub(1)?;
            let removed = remove_max(inner.children.get_mut(last)?, counts)?;
            fix_child(inner, last, counts);
            Some(removed)
        }
    }
}

/// After a removal below child `i`: refill it from a sibling or merge it with one if it fell
/// below [`MIN`].
fn fix_child(inner: &mut Inner, i: usize, counts: &mut NodeCounts) {
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
    } else if left == i {
        rotate_left(inner, left);
    } else {
        rotate_right(inner, left);
    }
}

/// Moves the separator between children `left` and `left + 1` down to the front of the right
/// child, and the left child's last item (and last child) up into its place.
fn rotate_right(inner: &mut Inner, left: usize) {
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
            insert_child(&mut ri.children, 0, c);
        }
    }
}

/// Mirror of [`rotate_right`]: the right child's first item goes up, the separator down to the
/// end of the left child.
fn rotate_left(inner: &mut Inner, left: usize) {
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
            let end = li.children.len();
            insert_child(&mut li.children, end, c);
        }
    }
}

/// Merges child `left + 1` and the separator between them into child `left`.
fn merge(inner: &mut Inner, left: usize, counts: &mut NodeCounts) {
    let right_pos = left.saturating_add(1);
    if right_pos >= inner.children.len() {
        return;
    }
    let Some(separator) = inner.items.remove(left) else {
        return;
    };
    let right = inner.children.remove(right_pos);
    let Some(l) = inner.children.get_mut(left) else {
        return;
    };
    l.items_mut().push(separator);
    l.items_mut().extend(right.items().as_slice());
    match (l, right) {
        (Node::Inner(li), Node::Inner(mut ri)) => {
            li.children.reserve_exact(ri.children.len());
            li.children.append(&mut ri.children);
            counts.inner = counts.inner.saturating_sub(1);
        }
        _ => counts.leaves = counts.leaves.saturating_sub(1),
    }
}

/// Mutable references to children `i` and `i + 1`.
fn pair(children: &mut [Node], i: usize) -> Option<(&mut Node, &mut Node)> {
    let (a, b) = children.split_at_mut_checked(i.checked_add(1)?)?;
    Some((a.last_mut()?, b.first_mut()?))
}

/// In-order iterator: a stack of (node, next item index).
pub struct Iter<'a> {
    stack: [Option<(&'a Node, usize)>; MAX_DEPTH],
    depth: usize,
}

impl<'a> Iter<'a> {
    fn push(&mut self, node: &'a Node, pos: usize) -> bool {
        match self.stack.get_mut(self.depth) {
            Some(slot) => {
                *slot = Some((node, pos));
                self.depth = self.depth.saturating_add(1);
                true
            }
            None => false,
        }
    }

    fn top(&self) -> Option<(&'a Node, usize)> {
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

impl Iterator for Iter<'_> {
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

    /// Handles whose key is `keys[h]`.
    struct Model {
        keys: Vec<i64>,
        tree: HTree,
        set: BTreeSet<(i64, u32)>,
    }

    impl Model {
        fn new() -> Model {
            Model {
                keys: Vec::new(),
                tree: HTree::default(),
                set: BTreeSet::new(),
            }
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
        }
    }

    #[test]
    fn appends_fill_leaves() {
        let mut m = Model::new();
        for i in 0..10_000 {
            m.insert(i);
        }
        m.check();
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
            while !m.set.is_empty() {
                m.remove_nth(7);
                if m.set.len() % 97 == 0 {
                    m.check();
                }
            }
            m.check();
        }
    }
}
