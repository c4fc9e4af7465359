//! A key opened through the raw module API, for every command and callback of this module that
//! reads a value and may write it.
//!
//! Why not the crate's `RedisKeyWritable`: it offers only relative expiries (window keys need
//! `RedisModule_SetAbsExpire`: absolute unix ms, so replicas and the AOF get the same instant),
//! and a writable open of it always marks the key modified. The module runs with
//! `REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED` (set in `init`): a writable [`ModuleKey`]
//! signals the key as modified (`WATCH`, client tracking) when it closes, unless the caller
//! said [`ModuleKey::unchanged`]. So a write path opens its key once, decides, and only a call
//! that wrote anything touches `WATCH` — one key lookup per write instead of a read-only open
//! to decide and a writable one to apply (issue 5).
//!
//! Every writable open in this module goes through here: with the option set, a writable key
//! opened any other way would never be signalled.

use std::marker::PhantomData;
use std::os::raw::{c_int, c_void};

use redis_module::native_types::RedisType;
use redis_module::{key::verify_type, raw, Context, RedisError, RedisString};

/// `REDISMODULE_OK` as the API functions return it.
const OK: c_int = 0;

fn missing_api(name: &str) -> RedisError {
    RedisError::String(format!("ERR this Redis lacks the module API {name}"))
}

/// Reads one of the API's function pointers (written once by `RedisModule_Init`).
macro_rules! api {
    ($name:ident) => {
        // SAFETY: a copy of a pointer written once, before any command runs.
        unsafe { raw::$name }.ok_or_else(|| missing_api(stringify!($name)))
    };
}

/// A key open for reading and writing; closed on drop, signalled as modified first unless
/// declared [`unchanged`](ModuleKey::unchanged). (Reads that never write use the crate's
/// read-only `Context::open_key`.)
pub struct ModuleKey<'a> {
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    /// Never null (a failed open is an error).
    inner: *mut raw::RedisModuleKey,
    signal: bool,
    /// The key's module type and value as of the open (null: empty, or not a module value),
    /// kept by [`set_value`](ModuleKey::set_value) and [`delete`](ModuleKey::delete), the only
    /// ways this module changes them while the key is open: one pair of API calls per open
    /// instead of one per read (a multi-key write reads each value three times or more).
    ty: *mut raw::RedisModuleType,
    value: *mut c_void,
    /// The key name is borrowed: it must outlive the open key.
    _name: PhantomData<&'a RedisString>,
}

impl<'a> ModuleKey<'a> {
    /// Opens `name` for reading and writing. Signals it as modified on close unless
    /// [`unchanged`](ModuleKey::unchanged) is called.
    // Inlined: its result, returned through memory, stalled MRESERVE (docs/benchmarks.md).
    #[inline(always)]
    pub fn open_writable(ctx: &Context, name: &'a RedisString) -> Result<Self, RedisError> {
        let inner = raw::open_key(
            ctx.ctx,
            name.inner,
            raw::KeyMode::READ | raw::KeyMode::WRITE,
        );
        if inner.is_null() {
            return Err(RedisError::Str("ERR could not open the key for writing"));
        }
        let mut key = Self {
            ctx: ctx.ctx,
            name: name.inner,
            inner,
            signal: true,
            ty: std::ptr::null_mut(),
            value: std::ptr::null_mut(),
            _name: PhantomData,
        };
        key.load_type_and_value()?;
        Ok(key)
    }

    /// Reads the key's module type and value into the cache.
    // Inlined: its result, returned through memory, stalled MRESERVE (docs/benchmarks.md).
    #[inline(always)]
    fn load_type_and_value(&mut self) -> Result<(), RedisError> {
        let get_type = api!(RedisModule_ModuleTypeGetType)?;
        // SAFETY: the key is open; the type is null for an empty key or a non-module value.
        self.ty = unsafe { get_type(self.inner) };
        self.value = if self.ty.is_null() {
            std::ptr::null_mut()
        } else {
            let get = api!(RedisModule_ModuleTypeGetValue)?;
            // SAFETY: the key is open and holds a module value.
            unsafe { get(self.inner) }
        };
        Ok(())
    }

    /// Nothing was written: closing does not signal the key as modified.
    pub fn unchanged(&mut self) {
        self.signal = false;
    }

    /// The value at this key if it is of type `ty`: `None` if the key is empty, `WRONGTYPE`
    /// if it holds anything else.
    #[inline]
    pub fn value<T>(&self, ty: &RedisType) -> Result<Option<&T>, RedisError> {
        Ok(self.raw_value::<T>(ty)?.and_then(|v| {
            // SAFETY: a value of type `ty` is a `Box<T>` this module created; `&self` keeps
            // the key open for the borrow.
            unsafe { v.as_ref() }
        }))
    }

    /// Like [`value`](ModuleKey::value), mutable.
    #[inline]
    pub fn value_mut<T>(&mut self, ty: &RedisType) -> Result<Option<&mut T>, RedisError> {
        Ok(self.raw_value::<T>(ty)?.and_then(|v| {
            // SAFETY: as in `value`; `&mut self` excludes any other access through this key.
            unsafe { v.as_mut() }
        }))
    }

    /// True if the key holds a value of the module type `ty` (false: empty, or another type).
    #[inline]
    pub fn holds(&self, ty: &RedisType) -> bool {
        !self.ty.is_null() && self.ty == *ty.raw_type.borrow()
    }

    #[inline]
    fn raw_value<T>(&self, ty: &RedisType) -> Result<Option<*mut T>, RedisError> {
        if !self.holds(ty) {
            // Not ours: empty (no value), or another type (WRONGTYPE).
            crate::shell::wrongtype(verify_type(self.inner, ty))?;
            return Ok(None);
        }
        // The value of type `ty` read at the open (or stored since).
        let value = self.value.cast::<T>();
        Ok((!value.is_null()).then_some(value))
    }

    /// Stores `value` (of type `ty`) as the key's value, replacing any value of that type and
    /// the key's expiry.
    pub fn set_value<T>(&mut self, ty: &RedisType, value: T) -> Result<(), RedisError> {
        crate::shell::wrongtype(verify_type(self.inner, ty))?;
        let set = api!(RedisModule_ModuleTypeSetValue)?;
        let value = Box::into_raw(Box::new(value)).cast::<c_void>();
        // SAFETY: the key is open for writing; on success Redis owns the value and frees it
        // through the type's `free` callback (which drops a `Box<T>`).
        let status = unsafe { set(self.inner, *ty.raw_type.borrow(), value) };
        if status == OK {
            self.ty = *ty.raw_type.borrow();
            self.value = value;
            Ok(())
        } else {
            // SAFETY: Redis refused the value, so it is still ours.
            drop(unsafe { Box::from_raw(value.cast::<T>()) });
            Err(RedisError::Str("ERR could not store the value"))
        }
    }

    /// Sets the key to expire at `at_ms` (absolute unix ms). The key must hold a value.
    pub fn set_abs_expire(&self, at_ms: i64) -> Result<(), RedisError> {
        let set = api!(RedisModule_SetAbsExpire)?;
        // SAFETY: the key is open (Redis refuses a read-only or empty one with an error).
        if !self.inner.is_null() && unsafe { set(self.inner, at_ms) } == OK {
            Ok(())
        } else {
            Err(RedisError::Str("ERR could not set the key's expiry"))
        }
    }

    /// Removes the key's expiry (a no-op if it has none). The key must hold a value.
    pub fn remove_expire(&self) -> Result<(), RedisError> {
        let get = api!(RedisModule_GetExpire)?;
        let set = api!(RedisModule_SetExpire)?;
        // SAFETY: the key is open for writing; GetExpire answers -1 (REDISMODULE_NO_EXPIRE)
        // for a key without expiry, and SetExpire with -1 removes one.
        unsafe {
            if self.inner.is_null() || get(self.inner) == -1 || set(self.inner, -1) == OK {
                Ok(())
            } else {
                Err(RedisError::Str("ERR could not remove the key's expiry"))
            }
        }
    }

    /// Deletes the key (a no-op if it is empty).
    pub fn delete(&mut self) -> Result<(), RedisError> {
        let delete = api!(RedisModule_DeleteKey)?;
        // SAFETY: the key is open (Redis refuses a read-only one with an error).
        if !self.inner.is_null() && unsafe { delete(self.inner) } == OK {
            self.ty = std::ptr::null_mut();
            self.value = std::ptr::null_mut();
            Ok(())
        } else {
            Err(RedisError::Str("ERR could not delete the key"))
        }
    }
}

impl Drop for ModuleKey<'_> {
    fn drop(&mut self) {
        if self.signal {
            // SAFETY: the context and the key name outlive this key (the borrow says so).
            unsafe {
                if let Some(signal) = raw::RedisModule_SignalModifiedKey {
                    signal(self.ctx, self.name);
                }
            }
        }
        raw::close_key(self.inner);
    }
}

/// Asks the CPU to start loading `bytes` from `address` into its cache, without waiting: a
/// multi-key command asks it for what lies below each opened key's value (index roots, the
/// next slot, a queue's ends), so that those lines arrive while the other keys are worked on,
/// instead of one miss after another. Nothing happens for a null address or on other
/// architectures.
pub fn prefetch(address: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if address.is_null() {
            return;
        }
        // Every line the span touches: an unaligned span (a 40-byte slot) can end in a line
        // its first byte is not in.
        // Over line offsets, not `step_by` over addresses: that cost more than the prefetches.
        let start = address as usize;
        let lines = ((start & 63).saturating_add(bytes)).div_ceil(64);
        let first = address.cast::<i8>().wrapping_sub(start & 63);
        for i in 0..lines {
            // SAFETY: a prefetch never faults and has no visible effect, whatever the address;
            // `wrapping_add` makes no claim about the allocation.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    first.wrapping_add(i.wrapping_mul(64)),
                );
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (address, bytes);
}
