//! The wire form of ledger effects, as replicated and written to the AOF:
//!
//! `QUOTA.APPLY key at_ms EFFECT args [EFFECT args ...]` with
//! - `CONFIG limit used overdraft max_reserve(-1 = none) default_ttl_ms period tz anchor|- start|- end|-
//!   [ONEXPIRE CHARGE|ELAPSED] [UNIT unit_ms]` (the two tails only when not the defaults, so
//!   a budget that uses neither writes what earlier versions wrote)
//! - `RESET start_ms end_ms` (a period boundary passed)
//! - `GRANT id amount deadline_ms` · `SETTLE id actual` · `LATE id actual` · `ROLLBACK id`
//! - `RELEASE id [ONEXPIRE CHARGE|ELAPSED charge]` (no tail: released for free) ·
//!   `EXTEND id deadline_ms` (the step's time is the heartbeat) · `CHARGE amount overrun` ·
//!   `CHARGEID amount overrun id`
//! - `FORGET id`
//! - `FORCED amount overrun` · `FORCEDID amount overrun id`: a charge made with FORCE
//! - `USAGE stream max_len` · `NOUSAGE`: the usage log (QUOTA.SET ... STREAM)
//! - `LOGGED ms seq len`, right after an effect that added a usage entry (issue 21): the
//!   entry's stream id `ms-seq` on the master and the stream's length after its trim. A
//!   replica or AOF replay derives the same entry from the same effect and state and adds it
//!   with that id, then trims to exactly `len` ([`Logged`]). Lines without it (and the
//!   `XADD` that followed them, written before) load as before.
//!
//! `ONEXPIRE` and `UNIT` are no effect names, so an optional tail is never mistaken for the
//! next effect.
//!
//! Every value is resolved (the master's time, generated ids, default TTLs), so applying the
//! same stream to the same state gives the same state on any server.
//!
//! Since issue 5 a master sends the one-argument form `QUOTA.APPLY key <packed>`: the same
//! tokens, `at_ms` first, in one [`Packed`] string. Both forms are accepted (AOF files and
//! masters of earlier versions send the multi-argument one).

use redis_module::RedisError;

use crate::core::book::Id;
use crate::core::ledger::{Effect, OnExpire, Settings, UsageLog};
use crate::core::period::{Period, PeriodKind};
use crate::shell::args::{check_id, parse_i64, syntax_error};
use crate::shell::config::MAX_ID_LENGTH_RANGE;
use crate::shell::reply::error_reply;

/// Where the tokens of an effect go: a token list (the multi-argument form) or a [`Packed`]
/// string (the one-argument form).
pub trait TokenSink {
    /// A byte-string token (an id, a zone name).
    fn bytes(&mut self, b: &[u8]);
    /// An integer token.
    fn int(&mut self, n: i64);
    /// An effect or period name: ASCII letters only.
    fn word(&mut self, w: &'static str) {
        self.bytes(w.as_bytes());
    }
    /// An unsigned integer token (a stream id's part).
    fn uint(&mut self, n: u64);
    /// `-` for none.
    fn opt(&mut self, n: Option<i64>) {
        match n {
            Some(n) => self.int(n),
            None => self.word("-"),
        }
    }
}

/// Token lists: the multi-argument form `QUOTA.APPLY key at_ms EFFECT args ...`.
impl TokenSink for Vec<Vec<u8>> {
    fn bytes(&mut self, b: &[u8]) {
        self.push(b.to_vec());
    }
    fn int(&mut self, n: i64) {
        self.push(itoa::Buffer::new().format(n).as_bytes().to_vec());
    }
    fn uint(&mut self, n: u64) {
        self.push(itoa::Buffer::new().format(n).as_bytes().to_vec());
    }
}

/// The usage entry a master added for the effect at index `after` of a line (the one just
/// before the `LOGGED` token): its stream id `ms-seq`, and the stream's length `len` once
/// trimmed after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Logged {
    /// Index of the effect (in the line's effects) whose entry this is.
    pub after: usize,
    /// The entry id's milliseconds part.
    pub ms: u64,
    /// The entry id's sequence part.
    pub seq: u64,
    /// The stream's length after the entry and its trim (at least 1).
    pub len: i64,
}

/// Writes a `LOGGED ms seq len` token group (after the tokens of the effect it belongs to).
pub fn write_logged(l: &Logged, out: &mut impl TokenSink) {
    out.word("LOGGED");
    out.uint(l.ms);
    out.uint(l.seq);
    out.int(l.len);
}

/// Writes effects, each followed by the `LOGGED` token of its entry if `logged` has one
/// (`logged` in effect order, as [`decode_logged`] gives it back).
pub fn write_all(list: &[Effect], logged: &[Logged], out: &mut impl TokenSink) {
    let mut marks = logged.iter().peekable();
    for (i, e) in list.iter().enumerate() {
        write(e, out);
        while let Some(l) = marks.next_if(|l| l.after == i) {
            write_logged(l, out);
        }
    }
}

/// Writes the tokens of one effect: the one description of the wire format.
pub fn write(effect: &Effect, out: &mut impl TokenSink) {
    match effect {
        Effect::Configure {
            settings,
            used,
            period,
            bounds,
        } => {
            out.word("CONFIG");
            out.int(settings.limit);
            out.int(*used);
            out.int(settings.overdraft);
            out.int(settings.max_reserve.unwrap_or(-1));
            out.int(settings.default_ttl_ms);
            out.word(period.kind.as_str());
            out.bytes(period.tz.as_bytes());
            out.opt(period.anchor_ms);
            out.opt(bounds.map(|b| b.0));
            out.opt(bounds.map(|b| b.1));
            if settings.on_expire != OnExpire::Release {
                out.word("ONEXPIRE");
                out.word(settings.on_expire.as_str());
            }
            if let Some(unit) = settings.unit_ms {
                out.word("UNIT");
                out.int(unit);
            }
        }
        Effect::Reset { start_ms, end_ms } => {
            out.word("RESET");
            out.int(*start_ms);
            out.int(*end_ms);
        }
        Effect::Grant {
            id,
            amount,
            deadline_ms,
        } => {
            out.word("GRANT");
            out.bytes(id);
            out.int(*amount);
            out.int(*deadline_ms);
        }
        Effect::Settle { id, actual } => {
            out.word("SETTLE");
            out.bytes(id);
            out.int(*actual);
        }
        Effect::SettleLate { id, actual } => {
            out.word("LATE");
            out.bytes(id);
            out.int(*actual);
        }
        Effect::Rollback { id } => {
            out.word("ROLLBACK");
            out.bytes(id);
        }
        Effect::Release {
            id,
            on_expire,
            charge,
        } => {
            out.word("RELEASE");
            out.bytes(id);
            if *on_expire != OnExpire::Release {
                out.word("ONEXPIRE");
                out.word(on_expire.as_str());
                out.int(*charge);
            }
        }
        Effect::Extend { id, deadline_ms } => {
            out.word("EXTEND");
            out.bytes(id);
            out.int(*deadline_ms);
        }
        Effect::Charge {
            amount,
            overrun,
            id: None,
            forced,
        } => {
            out.word(if *forced { "FORCED" } else { "CHARGE" });
            out.int(*amount);
            out.int(*overrun);
        }
        Effect::Charge {
            amount,
            overrun,
            id: Some(id),
            forced,
        } => {
            out.word(if *forced { "FORCEDID" } else { "CHARGEID" });
            out.int(*amount);
            out.int(*overrun);
            out.bytes(id);
        }
        Effect::Usage { log: Some(log) } => {
            out.word("USAGE");
            out.bytes(&log.stream);
            out.int(log.max_len);
        }
        Effect::Usage { log: None } => out.word("NOUSAGE"),
        Effect::Forget { id } => {
            out.word("FORGET");
            out.bytes(id);
        }
    }
}

/// The one-argument form of a token list, e.g. `1764485000000 GRANT 15:1764485000000-0 5
/// 1764488600000`: tokens separated by one space; integers and names as they are, byte
/// strings (ids, zones: any bytes) as `<len>:<bytes>` (a netstring without the trailing comma).
/// One Redis string to replicate instead of one per token (issue 5: the write path's cost).
#[derive(Debug, Default)]
pub struct Packed {
    buf: Vec<u8>,
}

impl Packed {
    /// An empty string with room for `n` bytes.
    pub fn with_capacity(n: usize) -> Packed {
        Packed {
            buf: Vec::with_capacity(n),
        }
    }

    /// The packed string written so far (one Redis string argument).
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Empties the string, keeping its allocation.
    pub fn clear(&mut self) {
        self.buf.clear();
    }

    /// Gives back memory beyond `n` bytes.
    pub fn shrink_to(&mut self, n: usize) {
        self.buf.shrink_to(n);
    }

    fn sep(&mut self) {
        if !self.buf.is_empty() {
            self.buf.push(b' ');
        }
    }
}

impl TokenSink for Packed {
    fn bytes(&mut self, b: &[u8]) {
        self.sep();
        self.buf
            .extend_from_slice(itoa::Buffer::new().format(b.len()).as_bytes());
        self.buf.push(b':');
        self.buf.extend_from_slice(b);
    }
    fn int(&mut self, n: i64) {
        self.sep();
        self.buf
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    }
    fn word(&mut self, w: &'static str) {
        self.sep();
        self.buf.extend_from_slice(w.as_bytes());
    }
    fn uint(&mut self, n: u64) {
        self.sep();
        self.buf
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    }
}

/// Splits a [`Packed`] string back into its tokens. Errors on an empty token, a doubled or
/// trailing space, or a length prefix that is not the decimal count (no leading zero) of the
/// bytes that follow.
pub fn unpack(packed: &[u8]) -> Result<Vec<&[u8]>, RedisError> {
    let bad = || RedisError::Str("ERR malformed packed effects");
    let mut tokens = Vec::new();
    let mut rest = packed;
    while !rest.is_empty() {
        let end = rest
            .iter()
            .position(|&c| c == b' ' || c == b':')
            .unwrap_or(rest.len());
        let (head, tail) = rest.split_at(end);
        let (token, after) = if tail.first() == Some(&b':') {
            let len = std::str::from_utf8(head)
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
                // One spelling per length, as the master writes it: no leading zero.
                .filter(|s| s.len() == 1 || !s.starts_with('0'))
                .and_then(|s| s.parse::<usize>().ok())
                .ok_or_else(bad)?;
            let body = tail.get(1..).ok_or_else(bad)?;
            if body.len() < len {
                return Err(bad());
            }
            body.split_at(len)
        } else {
            (head, tail)
        };
        if token.is_empty() && tail.first() != Some(&b':') {
            return Err(bad());
        }
        tokens.push(token);
        rest = match after.split_first() {
            None => after,
            Some((b' ', more)) if !more.is_empty() => more,
            _ => return Err(bad()),
        };
    }
    Ok(tokens)
}

/// `-` or an integer.
fn parse_opt(token: &[u8]) -> Result<Option<i64>, RedisError> {
    if token == b"-" {
        Ok(None)
    } else {
        parse_i64(token).map(Some)
    }
}

/// An effect's id: 1..=65536 bytes, as any command takes one. A master never writes another
/// (a forged AOF line could: an empty or longer id would then be stuck, as no command can name
/// it).
fn effect_id(token: &[u8]) -> Result<Id, RedisError> {
    check_id(token, MAX_ID_LENGTH_RANGE.1)?;
    Ok(token.into())
}

/// Parses effects from tokens (everything after `at_ms`), refusing `LOGGED` (see
/// [`decode_logged`] for a replicated line).
pub fn decode<'a, I>(tokens: I) -> Result<Vec<Effect>, RedisError>
where
    I: IntoIterator<Item = &'a [u8]>,
{
    let (effects, logged) = decode_logged(tokens)?;
    if logged.is_empty() {
        Ok(effects)
    } else {
        Err(RedisError::Str(
            "ERR QUOTA.APPLY: LOGGED is not allowed here",
        ))
    }
}

/// A stream id part: decimal digits only, no leading zero.
fn parse_u64(token: &[u8]) -> Result<u64, RedisError> {
    let bad = || RedisError::Str("ERR QUOTA.APPLY: bad LOGGED stream id");
    if token.is_empty()
        || !token.iter().all(u8::is_ascii_digit)
        || (token.len() > 1 && token.first() == Some(&b'0'))
    {
        return Err(bad());
    }
    std::str::from_utf8(token)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(bad)
}

/// Parses a replicated line's effects and the `LOGGED` tokens among them (everything after
/// `at_ms`). A `LOGGED` must follow an effect that can log (a settle, a charge, ...), at most
/// one per effect, with an id above `0-0` and a length of at least 1: anything else is
/// refused here, before anything is applied.
pub fn decode_logged<'a, I>(tokens: I) -> Result<(Vec<Effect>, Vec<Logged>), RedisError>
where
    I: IntoIterator<Item = &'a [u8]>,
{
    let mut it = tokens.into_iter().peekable();
    let mut effects = Vec::new();
    let mut logged: Vec<Logged> = Vec::new();
    let missing = || RedisError::Str("ERR QUOTA.APPLY: an effect is missing an argument");
    let next = |it: &mut std::iter::Peekable<I::IntoIter>| it.next().ok_or_else(missing);
    let on_expire = |token: &[u8]| {
        OnExpire::parse(token).ok_or(RedisError::Str("ERR QUOTA.APPLY: bad ONEXPIRE policy"))
    };
    while let Some(op) = it.next() {
        if op == b"LOGGED" {
            let after = effects
                .len()
                .checked_sub(1)
                .filter(|&i| logged.last().is_none_or(|l| l.after != i))
                .filter(|&i| effects.get(i).is_some_and(crate::shell::usage::logs))
                .ok_or(RedisError::Str(
                    "ERR QUOTA.APPLY: LOGGED must follow an effect that logs, once",
                ))?;
            let ms = parse_u64(next(&mut it)?)?;
            let seq = parse_u64(next(&mut it)?)?;
            let len = parse_i64(next(&mut it)?)?;
            if (ms, seq) == (0, 0) || len < 1 {
                return Err(RedisError::Str("ERR QUOTA.APPLY: bad LOGGED id or length"));
            }
            logged.push(Logged {
                after,
                ms,
                seq,
                len,
            });
            continue;
        }
        let effect = match op {
            b"CONFIG" => {
                let limit = parse_i64(next(&mut it)?)?;
                let used = parse_i64(next(&mut it)?)?;
                let overdraft = parse_i64(next(&mut it)?)?;
                let max = parse_i64(next(&mut it)?)?;
                let default_ttl_ms = parse_i64(next(&mut it)?)?;
                let kind = PeriodKind::parse(next(&mut it)?).map_err(error_reply)?;
                let tz = next(&mut it)?;
                let anchor = parse_opt(next(&mut it)?)?;
                let start = parse_opt(next(&mut it)?)?;
                let end = parse_opt(next(&mut it)?)?;
                let bounds = match (start, end) {
                    (Some(s), Some(e)) => Some((s, e)),
                    (None, None) => None,
                    _ => return Err(RedisError::Str("ERR QUOTA.APPLY: half a period")),
                };
                let mut policy = OnExpire::Release;
                if it.next_if(|t| *t == b"ONEXPIRE").is_some() {
                    policy = on_expire(next(&mut it)?)?;
                }
                let mut unit_ms = None;
                if it.next_if(|t| *t == b"UNIT").is_some() {
                    unit_ms = Some(parse_i64(next(&mut it)?)?);
                }
                Effect::Configure {
                    settings: Box::new(Settings {
                        limit,
                        overdraft,
                        max_reserve: (max >= 0).then_some(max),
                        default_ttl_ms,
                        on_expire: policy,
                        unit_ms,
                    }),
                    used,
                    period: Box::new(Period::new(kind, tz, anchor).map_err(error_reply)?),
                    bounds,
                }
            }
            b"RESET" => Effect::Reset {
                start_ms: parse_i64(next(&mut it)?)?,
                end_ms: parse_i64(next(&mut it)?)?,
            },
            b"GRANT" => Effect::Grant {
                id: effect_id(next(&mut it)?)?,
                amount: parse_i64(next(&mut it)?)?,
                deadline_ms: parse_i64(next(&mut it)?)?,
            },
            b"SETTLE" => Effect::Settle {
                id: effect_id(next(&mut it)?)?,
                actual: parse_i64(next(&mut it)?)?,
            },
            b"LATE" => Effect::SettleLate {
                id: effect_id(next(&mut it)?)?,
                actual: parse_i64(next(&mut it)?)?,
            },
            b"ROLLBACK" => Effect::Rollback {
                id: effect_id(next(&mut it)?)?,
            },
            b"RELEASE" => {
                let id = effect_id(next(&mut it)?)?;
                let (policy, charge) = if it.next_if(|t| *t == b"ONEXPIRE").is_some() {
                    (on_expire(next(&mut it)?)?, parse_i64(next(&mut it)?)?)
                } else {
                    (OnExpire::Release, 0)
                };
                Effect::Release {
                    id,
                    on_expire: policy,
                    charge,
                }
            }
            b"EXTEND" => Effect::Extend {
                id: effect_id(next(&mut it)?)?,
                deadline_ms: parse_i64(next(&mut it)?)?,
            },
            b"CHARGE" | b"FORCED" => Effect::Charge {
                amount: parse_i64(next(&mut it)?)?,
                overrun: parse_i64(next(&mut it)?)?,
                id: None,
                forced: op == b"FORCED",
            },
            b"CHARGEID" | b"FORCEDID" => Effect::Charge {
                amount: parse_i64(next(&mut it)?)?,
                overrun: parse_i64(next(&mut it)?)?,
                id: Some(effect_id(next(&mut it)?)?),
                forced: op == b"FORCEDID",
            },
            b"USAGE" => {
                let log = UsageLog {
                    stream: next(&mut it)?.to_vec(),
                    max_len: parse_i64(next(&mut it)?)?,
                };
                log.validate().map_err(error_reply)?;
                Effect::Usage { log: Some(log) }
            }
            b"NOUSAGE" => Effect::Usage { log: None },
            b"FORGET" => Effect::Forget {
                id: effect_id(next(&mut it)?)?,
            },
            other => return Err(syntax_error(other)),
        };
        effects.push(effect);
    }
    Ok((effects, logged))
}

#[cfg(test)]
mod tests {
    use super::decode;

    fn tokens(line: &[&[u8]]) -> Vec<Vec<u8>> {
        line.iter().map(|t| t.to_vec()).collect()
    }

    #[test]
    fn effect_ids_are_checked_as_command_ids_are() {
        let long = vec![b'x'; 65_537];
        let longest = vec![b'x'; 65_536];
        for bad in [&b""[..], &long] {
            for line in [
                tokens(&[b"GRANT", bad, b"1", b"100"]),
                tokens(&[b"SETTLE", bad, b"1"]),
                tokens(&[b"CHARGEID", b"1", b"0", bad]),
                tokens(&[b"FORGET", bad]),
            ] {
                assert!(decode(line.iter().map(Vec::as_slice)).is_err());
            }
        }
        let ok = tokens(&[b"GRANT", &longest, b"1", b"100"]);
        assert_eq!(
            decode(ok.iter().map(Vec::as_slice)).map(|e| e.len()).ok(),
            Some(1)
        );
    }
}
