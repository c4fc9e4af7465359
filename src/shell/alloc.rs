//! The module's global allocator.
//!
//! Inside redis-server every allocation goes through Redis's allocator, so module memory counts
//! in `used_memory` and `maxmemory`. When the crate is linked as an rlib into a plain test or
//! benchmark binary there is no Redis allocator (`RedisModule_Alloc` is never filled in): it then
//! uses the system allocator instead of aborting. Inside Redis the pointer is set by
//! `RedisModule_Init`, the first thing `RedisModule_OnLoad` does, before any Rust allocation.

use std::alloc::{GlobalAlloc, Layout, System};

use redis_module::alloc::RedisAlloc;
use redis_module::raw;

/// Redis's allocator when loaded as a module, the system allocator otherwise.
#[derive(Debug, Default, Clone, Copy)]
pub struct QuotaAlloc;

fn in_redis() -> bool {
    // SAFETY: a plain read of a function pointer written once, by RedisModule_Init.
    unsafe { std::ptr::addr_of!(raw::RedisModule_Alloc).read().is_some() }
}

unsafe impl GlobalAlloc for QuotaAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if in_redis() {
            RedisAlloc.alloc(layout)
        } else {
            System.alloc(layout)
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if in_redis() {
            RedisAlloc.dealloc(ptr, layout)
        } else {
            System.dealloc(ptr, layout)
        }
    }
}
