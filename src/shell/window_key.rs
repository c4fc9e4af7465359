//! A writable key holding an `rq-window` value, opened through the raw module API.
//!
//! The crate's `RedisKeyWritable` offers only relative expiries and no access to its raw key
//! pointer; window keys need `RedisModule_SetAbsExpire` (absolute unix ms, so replicas and the
//! AOF get the same instant). This wrapper opens the key itself, checks the type exactly as the
//! crate does (`WRONGTYPE` for any other type) and closes the key on drop.
//!
//! Open it only when the call will write: a writable open marks the key modified (WATCH, client
//! tracking) even if nothing is written.

use std::os::raw::{c_int, c_void};

use redis_module::{key::verify_type, raw, Context, RedisError, RedisString};

use crate::core::window::Window;
use crate::shell::window_type::WINDOW_TYPE;

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

/// An open writable key; closed on drop.
pub struct WindowKey {
    inner: *mut raw::RedisModuleKey,
}

impl WindowKey {
    /// Opens `name` for reading and writing.
    pub fn open_writable(ctx: &Context, name: &RedisString) -> Result<Self, RedisError> {
        let inner = raw::open_key(
            ctx.ctx,
            name.inner,
            raw::KeyMode::READ | raw::KeyMode::WRITE,
        );
        if inner.is_null() {
            return Err(RedisError::Str("ERR could not open the key for writing"));
        }
        Ok(Self { inner })
    }

    /// The window at this key: `None` if the key is empty, `WRONGTYPE` if it holds anything else.
    pub fn value_mut(&mut self) -> Result<Option<&mut Window>, RedisError> {
        crate::shell::wrongtype(verify_type(self.inner, &WINDOW_TYPE))?;
        let get = api!(RedisModule_ModuleTypeGetValue)?;
        // SAFETY: the key is open and holds our type (checked above) or nothing (null).
        let value = unsafe { get(self.inner) }.cast::<Window>();
        // SAFETY: a non-null value of our type is a `Box<Window>` we created; the borrow of
        // `self` keeps the key open and excludes any other access through it.
        Ok(unsafe { value.as_mut() })
    }

    /// Stores `window` as the key's value, replacing any window (and its expiry).
    pub fn set_value(&self, window: Window) -> Result<(), RedisError> {
        crate::shell::wrongtype(verify_type(self.inner, &WINDOW_TYPE))?;
        let set = api!(RedisModule_ModuleTypeSetValue)?;
        let value = Box::into_raw(Box::new(window)).cast::<c_void>();
        // SAFETY: the key is open for writing; on success Redis owns the value and frees it
        // through the type's `free` callback.
        let status = unsafe { set(self.inner, *WINDOW_TYPE.raw_type.borrow(), value) };
        if status == OK {
            crate::shell::stats::bump(&crate::shell::stats::WINDOW_KEYS);
            Ok(())
        } else {
            // SAFETY: Redis refused the value, so it is still ours.
            drop(unsafe { Box::from_raw(value.cast::<Window>()) });
            Err(RedisError::Str("ERR could not store the window value"))
        }
    }

    /// Sets the key to expire at `at_ms` (absolute unix ms). The key must hold a value.
    pub fn set_abs_expire(&self, at_ms: i64) -> Result<(), RedisError> {
        let set = api!(RedisModule_SetAbsExpire)?;
        // SAFETY: the key is open for writing.
        if unsafe { set(self.inner, at_ms) } == OK {
            Ok(())
        } else {
            Err(RedisError::Str("ERR could not set the key's expiry"))
        }
    }

    /// Deletes the key (a no-op if it is empty).
    pub fn delete(&self) -> Result<(), RedisError> {
        let delete = api!(RedisModule_DeleteKey)?;
        // SAFETY: the key is open for writing.
        if unsafe { delete(self.inner) } == OK {
            Ok(())
        } else {
            Err(RedisError::Str("ERR could not delete the key"))
        }
    }
}

impl Drop for WindowKey {
    fn drop(&mut self) {
        raw::close_key(self.inner);
    }
}
