//! The pure core: ledger, reservation book, ids, sliding windows and calendar periods.
//!
//! Plain Rust with no Redis types: time comes in as an argument (unix ms), nothing reads a clock,
//! and every state change is an explicit effect, so the same code runs on the master, on replicas
//! and in AOF replays, and is unit- and property-tested on its own.

pub mod book;
pub mod chunked;
pub mod error;
pub mod htree;
pub mod id;
pub mod ledger;
pub mod multi;
pub mod period;
pub mod remembered;
pub mod size_class;
pub mod window;
