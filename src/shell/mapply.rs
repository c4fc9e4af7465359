//! `QUOTA.MAPPLY numkeys key [key ...] <packed>`: the internal command that carries one
//! multi-key write (`QUOTA.MRESERVE`, `MSETTLE`, `MROLLBACK`, `MEXTEND`) to replicas and the
//! AOF in one replicated command, instead of one `QUOTA.APPLY` / `QUOTA.WAPPLY` per key (each
//! a command lookup by name and an entry in the stream: a quarter of a 5-key MRESERVE's cost).
//! Only keys with effects are listed, and `<packed>` is one [`Packed`] string in one of two
//! forms:
//!
//! - **Full:** for each key in order, a kind and that key's own packed line as one byte-string
//!   token: `B <len>:<at_ms EFFECT ...>` (a budget, the argument of `QUOTA.APPLY`, with its
//!   `LOGGED` usage entries) or `W <len>:<at_ms EFFECT ...>` (a configured window key, the
//!   effect form of `QUOTA.WAPPLY`).
//! - **Compact** (a reservation, since issue 19): when every key's effects are one
//!   grant of one id at one time — a budget's `GRANT id amount deadline_ms`, a window key's
//!   `COUNTID window_ms precision_ms cost id` — `R at_ms id` and then per key what differs:
//!   `D amount deadline_ms` (a budget's grant), `B amount` (a budget's grant with the deadline
//!   of the last `D`) or `W window_ms precision_ms cost` (a window key's count), e.g. `R
//!   1764485000000 15:1764485000000-0 D 1000 1764488600000 B 1000 W 60000 1000 1`. It is
//!   decoded into the very effects the full form carries, applied by the same functions: the
//!   state reached is the same byte for byte. The id, the time and the deadline are written
//!   once instead of once per key.
//!   A full-form line starts with `B` or `W`, so the first token tells the forms apart; lines
//!   in the full form (written by earlier versions, and by this one for anything else: a
//!   settle, a release of an expired reservation before a grant, a usage entry) still load.
//!
//! Each key's line is applied in key order, stopping at the first that does not apply (as a
//! single `QUOTA.APPLY` stops at its first effect that does not). Everything is decoded before
//! anything is applied: a malformed line changes nothing.
//!
//! Accepted only from the master link or while loading (a client could otherwise forge state).
//! The per-key lines written before this command existed (in MULTI/EXEC) still load: they are
//! plain `QUOTA.APPLY` / `QUOTA.WAPPLY` commands.

use std::cell::Cell;
use std::ffi::CStr;

use smallvec::SmallVec;

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::core::book::Id;
use crate::core::ledger::Effect;
use crate::core::window::WindowEffect;
use crate::shell::apply_cmds::{apply_budget_at_key, from_replication_or_loading, internal_only};
use crate::shell::args::{check_id, parse_i64, Args};
use crate::shell::clock::MAX_AT_MS;
use crate::shell::config::MAX_ID_LENGTH_RANGE;
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
pub struct Batch<'a, 'e> {
    keys: SmallVec<[&'a RedisString; MAX_KEYS]>,
    lines: Lines<'e>,
}

impl<'a, 'e> Batch<'a, 'e> {
    /// An empty batch for up to `n` keys.
    pub fn with_keys(n: usize) -> Batch<'a, 'e> {
        Batch {
            keys: SmallVec::with_capacity(n),
            lines: Lines::new(),
        }
    }

    /// Adds a budget's applied effects at `at_ms`, with the usage entries added for them
    /// (`logged`), (no effects: nothing added).
    pub fn budget(
        &mut self,
        key: &'a RedisString,
        at_ms: i64,
        list: &'e [Effect],
        logged: &[effects::Logged],
    ) {
        if !list.is_empty() {
            self.keys.push(key);
            self.lines.budget(at_ms, list, logged);
        }
    }

    /// Adds a window key's applied effects at `at_ms` (none: nothing added).
    pub fn window(&mut self, key: &'a RedisString, at_ms: i64, list: &'e [WindowEffect]) {
        if !list.is_empty() {
            self.keys.push(key);
            self.lines.window(at_ms, list);
        }
    }

    /// Replicates the batch as one `QUOTA.MAPPLY` (nothing if no key changed).
    pub fn replicate(self, ctx: &Context) {
        if !self.keys.is_empty() {
            replicate::replicate_keys_packed(ctx, MAPPLY, &self.keys, &self.lines.line);
        }
        self.lines.keep_buffers();
    }
}

/// The packed argument of one `QUOTA.MAPPLY`, written key by key.
///
/// While every key so far is one grant (a budget's `GRANT`, a window key's `COUNTID`) of one
/// id at one time, it is written in the compact form and each key's effect is held; the first
/// key that does not fit rewrites the held ones in the full form, which the rest then use.
struct Lines<'e> {
    /// Each key's effect so far while in the compact form; `None` in the full form.
    held: Option<SmallVec<[Held<'e>; MAX_KEYS]>>,
    /// The compact form's time, id and current deadline (the last `D`'s).
    at_ms: i64,
    id: &'e [u8],
    deadline_ms: Option<i64>,
    line: Packed,
    /// One key's line in the full form, reused for every key.
    inner: Packed,
}

/// One key's effect written in the compact form, kept to rewrite it in the full form.
#[derive(Clone, Copy)]
enum Held<'e> {
    /// A budget's `GRANT`.
    Budget(&'e Effect),
    /// A window key's `COUNTID`.
    Window(&'e WindowEffect),
}

std::thread_local! {
    /// The two buffers of the last batch, reused by the next (only the main thread writes):
    /// no allocation per command once they have grown to the longest line.
    static BUFFERS: Cell<Option<(Packed, Packed)>> = const { Cell::new(None) };
}

impl<'e> Lines<'e> {
    fn new() -> Lines<'e> {
        let (mut line, mut inner) = BUFFERS
            .try_with(Cell::take)
            .ok()
            .flatten()
            .unwrap_or_else(|| (Packed::with_capacity(256), Packed::with_capacity(128)));
        line.clear();
        inner.clear();
        Lines {
            held: Some(SmallVec::new()),
            at_ms: 0,
            id: &[],
            deadline_ms: None,
            line,
            inner,
        }
    }

    /// Gives the buffers back for the next batch.
    fn keep_buffers(self) {
        let (mut line, mut inner) = (self.line, self.inner);
        // A rare very long line (many keys with long ids) is not kept.
        line.shrink_to(4096);
        inner.shrink_to(4096);
        let _ = BUFFERS.try_with(|b| b.set(Some((line, inner))));
    }

    /// A budget's line (`list` not empty).
    fn budget(&mut self, at_ms: i64, list: &'e [Effect], logged: &[effects::Logged]) {
        if let (
            [effect @ Effect::Grant {
                id,
                amount,
                deadline_ms,
            }],
            [],
        ) = (list, logged)
        {
            if self.hold(at_ms, id, Held::Budget(effect)) {
                if self.deadline_ms == Some(*deadline_ms) {
                    self.line.word("B");
                    self.line.int(*amount);
                } else {
                    self.line.word("D");
                    self.line.int(*amount);
                    self.line.int(*deadline_ms);
                    self.deadline_ms = Some(*deadline_ms);
                }
                return;
            }
        }
        self.leave_compact();
        self.inner.clear();
        self.inner.int(at_ms);
        effects::write_all(list, logged, &mut self.inner);
        self.append("B");
    }

    /// A window key's line (`list` not empty).
    fn window(&mut self, at_ms: i64, list: &'e [WindowEffect]) {
        if let [effect @ WindowEffect::Count {
            window_ms,
            precision_ms,
            cost,
            id: Some(id),
        }] = list
        {
            if self.hold(at_ms, id, Held::Window(effect)) {
                self.line.word("W");
                self.line.int(*window_ms);
                self.line.int(*precision_ms);
                self.line.int(*cost);
                return;
            }
        }
        self.leave_compact();
        self.write_window(at_ms, list);
        self.append("W");
    }

    /// Holds a key's effect for the compact form (writing `R at_ms id` for the first) if the
    /// line is still in that form and the effect has the time and id of the ones held before;
    /// false if not (nothing done).
    fn hold(&mut self, at_ms: i64, id: &'e [u8], held: Held<'e>) -> bool {
        let Some(list) = self.held.as_mut() else {
            return false;
        };
        if list.is_empty() {
            (self.at_ms, self.id) = (at_ms, id);
            self.line.word("R");
            self.line.int(at_ms);
            self.line.bytes(id);
        } else if (self.at_ms, self.id) != (at_ms, id) {
            return false;
        }
        list.push(held);
        true
    }

    /// Leaves the compact form: rewrites the keys held so far in the full form.
    fn leave_compact(&mut self) {
        let Some(list) = self.held.take() else {
            return;
        };
        self.line.clear();
        for held in list {
            match held {
                Held::Budget(effect) => {
                    self.inner.clear();
                    self.inner.int(self.at_ms);
                    effects::write(effect, &mut self.inner);
                    self.append("B");
                }
                Held::Window(effect) => {
                    self.write_window(self.at_ms, std::slice::from_ref(effect));
                    self.append("W");
                }
            }
        }
    }

    /// Writes a window key's line into `inner`.
    fn write_window(&mut self, at_ms: i64, list: &[WindowEffect]) {
        self.inner.clear();
        self.inner.int(at_ms);
        for e in list {
            window_effects::write(e, &mut self.inner);
        }
    }

    /// Appends a kind and the line in `inner` (the full form).
    fn append(&mut self, kind: &'static str) {
        self.line.word(kind);
        self.line.bytes(self.inner.as_bytes());
    }
}

/// One key's decoded line.
#[derive(Debug, PartialEq, Eq)]
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

/// Decodes the compact form (after its `R`): `at_ms id`, then per key `D amount
/// deadline_ms`, `B amount` (the deadline of the last `D`) or `W window_ms precision_ms cost`,
/// into the very lines the full form would carry (`GRANT id amount deadline_ms`, `COUNTID
/// window_ms precision_ms cost id`, each at `at_ms`).
fn decode_compact(tokens: &[&[u8]]) -> Result<Vec<Line>, RedisError> {
    let (at, id, mut rest) = match tokens {
        [at, id, rest @ ..] if !rest.is_empty() => (parse_i64(at)?, *id, rest),
        _ => return Err(bad("a compact line without its time, id or keys")),
    };
    check_id(id, MAX_ID_LENGTH_RANGE.1)?;
    let id = Id::from_slice(id);
    let mut deadline: Option<i64> = None;
    let mut lines = Vec::with_capacity(MAX_KEYS.min(rest.len()));
    while !rest.is_empty() {
        let (amount, more) = match rest {
            [b"B", amount, more @ ..] => (amount, more),
            [b"D", amount, deadline_ms, more @ ..] => {
                deadline = Some(parse_i64(deadline_ms)?);
                (amount, more)
            }
            [b"W", window_ms, precision_ms, cost, more @ ..] => {
                if !(0..=MAX_AT_MS).contains(&at) {
                    return Err(bad("bad at_ms"));
                }
                let count = WindowEffect::Count {
                    window_ms: parse_i64(window_ms)?,
                    precision_ms: parse_i64(precision_ms)?,
                    cost: parse_i64(cost)?,
                    id: Some(id.clone()),
                };
                lines.push(Line::Window(at, vec![count]));
                rest = more;
                continue;
            }
            _ => return Err(bad("a malformed key in a compact line")),
        };
        let grant = Effect::Grant {
            id: id.clone(),
            amount: parse_i64(amount)?,
            deadline_ms: deadline.ok_or_else(|| bad("B before any D"))?,
        };
        lines.push(Line::Budget(at, vec![grant], Vec::new()));
        rest = more;
    }
    Ok(lines)
}

/// Decodes `<packed>` (either form) into one line per key, for `n` keys.
fn decode_packed(packed: &[u8], n: usize) -> Result<Vec<Line>, RedisError> {
    let tokens = effects::unpack(packed)?;
    let lines = match tokens.split_first() {
        Some((&b"R", rest)) => decode_compact(rest)?,
        _ => {
            if tokens.len() != n.saturating_mul(2) {
                return Err(bad("one kind and one line per key"));
            }
            tokens
                .chunks_exact(2)
                .map(|pair| match pair {
                    [kind, line] => decode_line(kind, line),
                    _ => Err(bad("one kind and one line per key")),
                })
                .collect::<Result<Vec<Line>, RedisError>>()?
        }
    };
    if lines.len() != n {
        return Err(bad("one line per key"));
    }
    Ok(lines)
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
    let lines = decode_packed(packed, n)?;
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

    /// One key's effects as the batch gets them.
    #[derive(Clone, Debug)]
    enum Key {
        Budget(i64, Vec<Effect>, Vec<effects::Logged>),
        Window(i64, Vec<WindowEffect>),
    }

    /// The packed string the batch writes for `keys`.
    fn pack(keys: &[Key]) -> Vec<u8> {
        let mut lines = Lines::new();
        for k in keys {
            match k {
                Key::Budget(at, list, logged) => lines.budget(*at, list, logged),
                Key::Window(at, list) => lines.window(*at, list),
            }
        }
        let out = lines.line.as_bytes().to_vec();
        lines.keep_buffers();
        out
    }

    /// What a replica decodes for `keys`: exactly their effects.
    fn expected(keys: &[Key]) -> Vec<Line> {
        keys.iter()
            .map(|k| match k.clone() {
                Key::Budget(at, list, logged) => Line::Budget(at, list, logged),
                Key::Window(at, list) => Line::Window(at, list),
            })
            .collect()
    }

    fn grant(id: &[u8], amount: i64, deadline_ms: i64) -> Effect {
        Effect::Grant {
            id: Id::from_slice(id),
            amount,
            deadline_ms,
        }
    }

    fn count(id: Option<&[u8]>, cost: i64) -> WindowEffect {
        WindowEffect::Count {
            window_ms: 60_000,
            precision_ms: 1000,
            cost,
            id: id.map(Id::from_slice),
        }
    }

    #[test]
    fn a_grant_on_every_key_is_written_in_the_compact_form() {
        let keys = [
            Key::Budget(7, vec![grant(b"r 1", 1000, 99)], vec![]),
            Key::Budget(7, vec![grant(b"r 1", 5, 99)], vec![]),
            Key::Window(7, vec![count(Some(b"r 1"), 1)]),
            Key::Budget(7, vec![grant(b"r 1", 6, 50)], vec![]),
            Key::Budget(7, vec![grant(b"r 1", 7, 99)], vec![]),
        ];
        let packed = pack(&keys);
        assert_eq!(
            String::from_utf8_lossy(&packed),
            "R 7 3:r 1 D 1000 99 B 5 W 60000 1000 1 D 6 50 D 7 99"
        );
        assert_eq!(decode_packed(&packed, 5).unwrap(), expected(&keys));
        // Only window keys: no deadline at all.
        let windows = [
            Key::Window(7, vec![count(Some(b"x"), 1)]),
            Key::Window(7, vec![count(Some(b"x"), 2)]),
        ];
        let packed = pack(&windows);
        assert_eq!(packed, b"R 7 1:x W 60000 1000 1 W 60000 1000 2");
        assert_eq!(decode_packed(&packed, 2).unwrap(), expected(&windows));
    }

    #[test]
    fn anything_but_one_grant_of_one_id_at_one_time_is_written_in_the_full_form() {
        let ok = Key::Budget(7, vec![grant(b"r", 1, 9)], vec![]);
        let win = Key::Window(7, vec![count(Some(b"r"), 1)]);
        let logged = effects::Logged {
            after: 0,
            ms: 1,
            seq: 0,
            len: 1,
        };
        let settle = Effect::Settle {
            id: Id::from_slice(b"r"),
            actual: 1,
        };
        for odd in [
            Key::Budget(8, vec![grant(b"r", 1, 9)], vec![]),
            Key::Budget(7, vec![grant(b"q", 1, 9)], vec![]),
            Key::Budget(7, vec![settle.clone(), grant(b"r", 1, 9)], vec![]),
            Key::Budget(7, vec![settle], vec![logged]),
            Key::Window(7, vec![count(None, 1)]),
            Key::Window(7, vec![count(Some(b"q"), 1)]),
            Key::Window(8, vec![count(Some(b"r"), 1)]),
            Key::Window(7, vec![count(Some(b"r"), 1), WindowEffect::Forget]),
        ] {
            // The odd key first, in the middle, and last.
            for keys in [
                vec![odd.clone(), ok.clone(), win.clone()],
                vec![ok.clone(), odd.clone(), win.clone()],
                vec![ok.clone(), win.clone(), odd.clone()],
            ] {
                let packed = pack(&keys);
                assert!(
                    packed.starts_with(b"B ") || packed.starts_with(b"W "),
                    "{:?}",
                    String::from_utf8_lossy(&packed)
                );
                assert_eq!(decode_packed(&packed, 3).unwrap(), expected(&keys));
                assert!(decode_packed(&packed, 2).is_err());
            }
        }
    }

    #[test]
    fn malformed_compact_lines_are_refused() {
        for bad in [
            &b"R"[..],
            b"R 5",
            b"R 5 2:r1",
            b"R 5 2:r1 B 3",
            b"R 5 2:r1 D 3",
            b"R 5 2:r1 D 3 x",
            b"R 5 0: D 1 2",
            b"R x 2:r1 D 1 2",
            b"R 5 2:r1 W 1 2",
            b"R -1 2:r1 W 1 2 3",
            b"R 5 2:r1 X 1",
            b"R 5 2:r1 D 1 2 B",
        ] {
            assert!(decode_packed(bad, 1).is_err(), "{:?}", bad);
        }
        assert!(decode_packed(b"R 5 2:r1 D 1 2 B 3", 2).is_ok());
        assert!(decode_packed(b"R 5 2:r1 D 1 2 B 3", 1).is_err());
        assert!(decode_packed(b"R 5 2:r1 D 1 2 B 3", 3).is_err());
    }

    proptest::proptest! {
        /// Whatever the keys' effects, what a replica decodes is exactly them, in the compact
        /// form when every key is one grant of one id at one time.
        #[test]
        fn any_batch_decodes_to_its_effects(
            picks in proptest::collection::vec((0usize..8, 0i64..2, 0usize..2, 0i64..3), 1..=MAX_KEYS),
        ) {
            let ids: [&[u8]; 2] = [b"1764485000000-0", b"r:2 x"];
            let keys: Vec<Key> = picks
                .iter()
                .map(|&(kind, at, id, n)| {
                    let (at, id) = (1_764_485_000_000 + at, ids.get(id).copied().unwrap_or(b"r"));
                    match kind {
                        0..=2 => Key::Budget(at, vec![grant(id, n, at + 1000 * n)], vec![]),
                        3 | 4 => Key::Window(at, vec![count(Some(id), n)]),
                        5 => Key::Budget(at, vec![Effect::Forget { id: Id::from_slice(b"old") }, grant(id, n, at)], vec![]),
                        6 => Key::Window(at, vec![count(None, n)]),
                        _ => Key::Budget(at, vec![Effect::Rollback { id: Id::from_slice(id) }], vec![]),
                    }
                })
                .collect();
            let packed = pack(&keys);
            proptest::prop_assert_eq!(decode_packed(&packed, keys.len()).unwrap(), expected(&keys));
            let compact = picks.iter().all(|&(kind, at, id, _)| {
                kind <= 4 && (at, id) == (picks[0].1, picks[0].2)
            });
            proptest::prop_assert_eq!(packed.starts_with(b"R "), compact);
        }

        /// Any bytes, and any sequence of the forms' tokens, decode without a panic; what is
        /// accepted has one line per key.
        #[test]
        fn any_packed_string_decodes_or_is_refused(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
            picks in proptest::collection::vec(0usize..14, 0..16),
            n in 0usize..6,
        ) {
            let vocabulary: [&[u8]; 14] = [
                b"R", b"B", b"D", b"W", b"0", b"-1", b"5", b"253397030400001",
                b"9223372036854775808", b"2:r1", b"0:", b"3:a b", b"x", b"4:1 GRANT",
            ];
            let tokens: Vec<&[u8]> = picks.iter().map(|&i| vocabulary[i]).collect();
            let joined = tokens.join(&b' ');
            for packed in [&bytes[..], &joined[..]] {
                if let Ok(lines) = decode_packed(packed, n) {
                    proptest::prop_assert_eq!(lines.len(), n);
                }
            }
        }
    }
}
