//! `QUOTA.MAPPLY numkeys key [key ...] <packed>`: the internal command that carries one
//! multi-key write (`QUOTA.MRESERVE`, `MSETTLE`, `MROLLBACK`, `MEXTEND`) to replicas and the
//! AOF in one replicated command, instead of one `QUOTA.APPLY` / `QUOTA.WAPPLY` per key (each
//! a command lookup by name and an entry in the stream: a quarter of a 5-key MRESERVE's cost).
//!
//! `<packed>` is one [`Packed`] string holding, for each key in order, a kind and that key's
//! own packed line as one byte-string token: `B <len>:<at_ms EFFECT ...>` (a budget, the
//! argument of `QUOTA.APPLY`, with its `LOGGED` usage entries) or `W <len>:<at_ms EFFECT ...>` (a configured window key, the
//! effect form of `QUOTA.WAPPLY`). Only keys with effects are listed. Each key's line is
//! applied by the same functions as those commands', in key order, stopping at the first that
//! does not apply (as a single `QUOTA.APPLY` stops at its first effect that does not).
//! Everything is decoded before anything is applied: a malformed line changes nothing.
//!
//! Accepted only from the master link or while loading (a client could otherwise forge state).
//! The per-key lines written before this command existed (in MULTI/EXEC) still load: they are
//! plain `QUOTA.APPLY` / `QUOTA.WAPPLY` commands.

use std::cell::Cell;
use std::ffi::CStr;

use smallvec::SmallVec;

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::core::ledger::Effect;
use crate::core::window::WindowEffect;
use crate::shell::apply_cmds::{apply_budget_at_key, from_replication_or_loading, internal_only};
use crate::shell::args::{parse_i64, Args};
use crate::shell::clock::MAX_AT_MS;
use crate::shell::effects::{self, Packed, TokenSink};
use crate::shell::key::ModuleKey;
use crate::shell::{key_specs, replicate, window_effects};

/// Name of the internal multi-key command.
pub const MAPPLY: &CStr = c"QUOTA.MAPPLY";

/// Most keys one line names (as the multi-key commands).
const MAX_KEYS: usize = crate::shell::multi_cmds::MAX_KEYS;

// Every line's keys fit one replicated command.
const _: () = assert!(MAX_KEYS <= replicate::MAX_REPLICATED_KEYS);

/// The effects applied to each key of one multi-key write, gathered to be replicated once.
pub struct Batch<'a> {
    keys: SmallVec<[&'a RedisString; MAX_KEYS]>,
    line: Packed,
    /// One key's line, reused for every key.
    inner: Packed,
}

std::thread_local! {
    /// The two buffers of the last batch, reused by the next (only the main thread writes):
    /// no allocation per command once they have grown to the longest line.
    static BUFFERS: Cell<Option<(Packed, Packed)>> = const { Cell::new(None) };
}

impl<'a> Batch<'a> {
    /// An empty batch for up to `n` keys.
    pub fn with_keys(n: usize) -> Batch<'a> {
        let (mut line, mut inner) = BUFFERS
            .try_with(Cell::take)
            .ok()
            .flatten()
            .unwrap_or_else(|| (Packed::with_capacity(256), Packed::with_capacity(128)));
        line.clear();
        inner.clear();
        Batch {
            keys: SmallVec::with_capacity(n),
            line,
            inner,
        }
    }

    /// Adds a budget's applied effects at `at_ms`, with the usage entries added for them
    /// (`logged`), (no effects: nothing added).
    pub fn budget(
        &mut self,
        key: &'a RedisString,
        at_ms: i64,
        list: &[Effect],
        logged: &[effects::Logged],
    ) {
        if list.is_empty() {
            return;
        }
        self.inner.clear();
        self.inner.int(at_ms);
        effects::write_all(list, logged, &mut self.inner);
        self.push(key, "B");
    }

    /// Adds a window key's applied effects at `at_ms` (none: nothing added).
    pub fn window(&mut self, key: &'a RedisString, at_ms: i64, list: &[WindowEffect]) {
        if list.is_empty() {
            return;
        }
        self.inner.clear();
        self.inner.int(at_ms);
        for e in list {
            window_effects::write(e, &mut self.inner);
        }
        self.push(key, "W");
    }

    /// Appends the key and its kind and line (in `inner`).
    fn push(&mut self, key: &'a RedisString, kind: &'static str) {
        self.keys.push(key);
        self.line.word(kind);
        self.line.bytes(self.inner.as_bytes());
    }

    /// Replicates the batch as one `QUOTA.MAPPLY` (nothing if no key changed).
    pub fn replicate(self, ctx: &Context) {
        if !self.keys.is_empty() {
            replicate::replicate_keys_packed(ctx, MAPPLY, &self.keys, &self.line);
        }
        let (mut line, mut inner) = (self.line, self.inner);
        // A rare very long line (many keys with long ids) is not kept.
        line.shrink_to(4096);
        inner.shrink_to(4096);
        let _ = BUFFERS.try_with(|b| b.set(Some((line, inner))));
    }
}

/// One key's decoded line.
enum Line {
    Budget(i64, Vec<Effect>, Vec<effects::Logged>),
    Window(i64, Vec<WindowEffect>),
}

fn bad(what: &str) -> RedisError {
    RedisError::String(format!("ERR QUOTA.MAPPLY: {what}"))
}

/// Decodes one key's kind and packed line.
fn decode_line(kind: &[u8], packed: &[u8]) -> Result<Line, RedisError> {
    let tokens = effects::unpack(packed)?;
    let (at, rest) = tokens.split_first().ok_or_else(|| bad("empty line"))?;
    let at_ms = parse_i64(at)?;
    if rest.is_empty() {
        return Err(bad("a key without effects"));
    }
    match kind {
        b"B" => {
            let (list, logged) = effects::decode_logged(rest.iter().copied())?;
            Ok(Line::Budget(at_ms, list, logged))
        }
        b"W" => {
            if !(0..=MAX_AT_MS).contains(&at_ms) {
                return Err(bad("bad at_ms"));
            }
            Ok(Line::Window(
                at_ms,
                window_effects::decode(rest.iter().copied())?,
            ))
        }
        _ => Err(bad("unknown kind")),
    }
}

/// `QUOTA.MAPPLY numkeys key [key ...] <packed>` → OK.
pub fn quota_mapply(ctx: &Context, args: &[RedisString]) -> RedisResult {
    // The keys, then the packed effects.
    let after = key_specs::After {
        per_key: 0,
        fixed: 1,
    };
    if key_specs::answer_key_positions(ctx, args, MAX_KEYS, after) {
        return Ok(RedisValue::NoReply);
    }
    if !from_replication_or_loading(ctx) {
        return Err(internal_only("QUOTA.MAPPLY"));
    }
    let mut a = Args::new(args, 3)?;
    let n = usize::try_from(a.next_i64()?)
        .ok()
        .filter(|n| (1..=MAX_KEYS).contains(n))
        .ok_or_else(|| bad("numkeys must be between 1 and 16"))?;
    let mut keys = Vec::with_capacity(n);
    for _ in 0..n {
        keys.push(a.next_string()?);
    }
    let packed = a.next_bytes()?;
    if !a.is_empty() {
        return Err(RedisError::WrongArity);
    }
    let tokens = effects::unpack(packed)?;
    if tokens.len() != n.saturating_mul(2) {
        return Err(bad("one kind and one line per key"));
    }
    let lines = tokens
        .chunks_exact(2)
        .map(|pair| match pair {
            [kind, line] => decode_line(kind, line),
            _ => Err(bad("one kind and one line per key")),
        })
        .collect::<Result<Vec<Line>, RedisError>>()?;
    let mut any = false;
    let mut error = None;
    for (key_name, line) in keys.into_iter().zip(&lines) {
        let (applied, err) = match line {
            Line::Budget(at, list, logged) => {
                match apply_budget_at_key(ctx, key_name, *at, list, logged) {
                    Ok(r) => (r.applied, r.error),
                    Err(e) => (0, Some(e)),
                }
            }
            Line::Window(at, list) => match ModuleKey::open_writable(ctx, key_name) {
                Ok(mut key) => window_effects::apply_at_key(ctx, &mut key, key_name, *at, list),
                Err(e) => (0, Some(e)),
            },
        };
        any |= applied > 0;
        if err.is_some() {
            error = err;
            break;
        }
    }
    if any {
        // Feeds this server's own AOF and sub-replicas (they stop at the same point).
        ctx.replicate_verbatim();
    }
    match error {
        Some(e) => Err(e),
        None => Ok(RedisValue::SimpleStringStatic("OK")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_decode_by_kind_and_refuse_the_malformed() {
        let mut inner = Packed::with_capacity(64);
        inner.int(5);
        effects::write(
            &Effect::Extend {
                id: b"r1"[..].into(),
                deadline_ms: 9,
            },
            &mut inner,
        );
        assert!(matches!(
            decode_line(b"B", inner.as_bytes()),
            Ok(Line::Budget(5, ref l, _)) if l.len() == 1
        ));
        let mut w = Packed::with_capacity(64);
        w.int(5);
        window_effects::write(&WindowEffect::Forget, &mut w);
        assert!(matches!(
            decode_line(b"W", w.as_bytes()),
            Ok(Line::Window(5, ref l)) if l.len() == 1
        ));
        assert!(decode_line(b"X", inner.as_bytes()).is_err());
        assert!(decode_line(b"W", inner.as_bytes()).is_err());
        assert!(decode_line(b"B", b"5").is_err());
        assert!(decode_line(b"B", b"").is_err());
    }
}
