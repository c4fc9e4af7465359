//! Argument parsing for QUOTA.* commands: a cursor over the command's arguments that yields
//! integers, byte strings and keywords, with errors that name the argument at fault and end
//! with the command's usage line (from [`crate::shell::command_docs`]).
//!
//! The cursor knows the command by its name in `argv[0]`; an error finds the argument's name
//! from its position (a positional one) or the keyword before it (an option's value). All of
//! that happens on the error path only: a call that parses costs what it did before.

use std::ffi::CStr;

use redis_module::{RedisError, RedisString};

use crate::core::error::printable_id;
use crate::core::ledger::MAX_TTL_MS;
use crate::shell::command_docs::{self, CommandDoc};

/// The standard Redis reply for a bad integer.
pub const NOT_AN_INTEGER: &str = "ERR value is not an integer or out of range";

/// A cursor over a command's arguments (after the command name).
pub struct Args<'a> {
    /// All of argv, the command name first.
    all: &'a [RedisString],
    /// The index in `all` of the next argument.
    pos: usize,
    /// The form of the command being parsed, by the option that makes it
    /// ([`CommandDoc::form_usage`]: `QUOTA.SET key WINDOW ...`); `None`: the whole usage.
    form: Option<&'static CStr>,
}

impl<'a> Args<'a> {
    /// Arguments after the command name; the arity error (with the usage line) if there are
    /// fewer than `min`.
    #[inline(always)]
    pub fn new(all: &'a [RedisString], min: usize) -> Result<Self, RedisError> {
        if all.len().saturating_sub(1) < min {
            return Err(Args {
                all,
                pos: 1,
                form: None,
            }
            .wrong_arity());
        }
        Ok(Args {
            all,
            pos: 1,
            form: None,
        })
    }

    /// From here on the call is the form that the option `token` makes (e.g. `WINDOW` of
    /// QUOTA.SET): error replies give that form's usage line only.
    pub fn set_form(&mut self, token: &'static CStr) {
        self.form = Some(token);
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.all.len()
    }

    /// How many arguments are left.
    pub fn remaining(&self) -> usize {
        self.all.len().saturating_sub(self.pos)
    }

    /// The next argument as bytes; if there is none, the error says what was expected (the
    /// value of the option just read, or more arguments).
    #[inline(always)]
    pub fn next_bytes(&mut self) -> Result<&'a [u8], RedisError> {
        let Some(arg) = self.all.get(self.pos) else {
            return Err(self.missing());
        };
        self.pos = self.pos.saturating_add(1);
        Ok(arg.as_slice())
    }

    /// The next argument as the `RedisString` (for keys).
    #[inline(always)]
    pub fn next_string(&mut self) -> Result<&'a RedisString, RedisError> {
        let Some(arg) = self.all.get(self.pos) else {
            return Err(self.wrong_arity());
        };
        self.pos = self.pos.saturating_add(1);
        Ok(arg)
    }

    /// The next argument as a signed 64-bit integer; the error names the argument.
    #[inline(always)]
    pub fn next_i64(&mut self) -> Result<i64, RedisError> {
        let bytes = self.next_bytes()?;
        match parse_canonical_i64(bytes) {
            Some(n) => Ok(n),
            None => Err(self.not_an_integer()),
        }
    }

    /// The next argument as a non-negative integer named `what` (for the error message).
    pub fn next_amount(&mut self, what: &str) -> Result<i64, RedisError> {
        let n = self.next_i64()?;
        if n < 0 {
            return Err(RedisError::String(format!(
                "ERR {what} must not be negative"
            )));
        }
        Ok(n)
    }

    /// The next argument as a reservation TTL in ms, `1..=`[`MAX_TTL_MS`], else `error`
    /// ([`BAD_TTL`] for the `TTL` option, [`BAD_TTL_MS`] for the `ttl_ms` argument).
    pub fn next_ttl(&mut self, error: &'static str) -> Result<i64, RedisError> {
        ttl_arg(self.next_i64()?, error)
    }

    /// The error for `token`, just read where an option was expected: a syntax error that says
    /// which options the command takes (or that the key was taken for an option's keyword).
    #[cold]
    #[inline(never)]
    pub fn unexpected(&self, token: &[u8]) -> RedisError {
        let near = format!("ERR syntax error near '{}'", printable_id(token));
        let Some(doc) = self.doc() else {
            return RedisError::String(near);
        };
        let why = match self.key_as_option(doc) {
            Some(hint) => hint,
            None if doc.args.iter().any(|a| a.optional) => {
                format!("{} takes no such option", doc.name.to_string_lossy())
            }
            None => format!("{} takes no more arguments", doc.name.to_string_lossy()),
        };
        RedisError::String(format!("{near}: {why}. Usage: {}", self.usage(doc)))
    }

    /// `ERR syntax error near '<token>': <why>. Usage: ...`, for a token the command knows but
    /// cannot take there (`why` says why).
    #[cold]
    #[inline(never)]
    pub fn syntax_error(&self, token: &[u8], why: &str) -> RedisError {
        let near = format!("ERR syntax error near '{}': {why}", printable_id(token));
        match self.doc() {
            Some(doc) => RedisError::String(format!("{near}. Usage: {}", self.usage(doc))),
            None => RedisError::String(near),
        }
    }

    /// `ERR wrong number of arguments for 'QUOTA.X' command` (as Redis itself words it for a
    /// module command: the name as registered), then the usage line.
    #[cold]
    #[inline(never)]
    pub fn wrong_arity(&self) -> RedisError {
        let Some(doc) = self.doc() else {
            let name = self.all.first().map_or(&b""[..], |n| n.as_slice());
            return RedisError::String(format!(
                "ERR wrong number of arguments for '{}' command",
                printable_id(name)
            ));
        };
        let hint = self
            .key_as_option(doc)
            .map_or_else(String::new, |h| format!(" ({h})"));
        RedisError::String(format!(
            "ERR wrong number of arguments for '{}' command{hint}. Usage: {}",
            doc.name.to_string_lossy(),
            self.usage(doc)
        ))
    }

    /// The usage line for error replies: the current form's ([`Args::set_form`]), else the
    /// command's.
    fn usage(&self, doc: &CommandDoc) -> String {
        self.form
            .and_then(|token| doc.form_usage(token))
            .unwrap_or_else(|| doc.usage())
    }

    /// The documentation of this command, if it has one.
    fn doc(&self) -> Option<&'static CommandDoc> {
        command_docs::find(self.all.first()?.as_slice())
    }

    /// A value missing at the end: the option just read needs one, or arguments are missing.
    #[cold]
    #[inline(never)]
    fn missing(&self) -> RedisError {
        match self.all.len().checked_sub(1).filter(|&last| last >= 2) {
            // The last argument was read as an option's keyword: its value is missing.
            Some(last) => self.needs_value(self.all.get(last).map_or(&b""[..], |a| a.as_slice())),
            None => self.wrong_arity(),
        }
    }

    /// `ERR <option> needs a value: <its form>. Usage: ...` for the option `option` of this
    /// command (one whose values are not all there), else the wrong-arity error.
    #[cold]
    #[inline(never)]
    pub fn needs_value(&self, option: &[u8]) -> RedisError {
        self.needs(option, "a value")
    }

    /// `ERR <option> needs <what>: <its form>. Usage: ...` (e.g. `what` = "window_ms after
    /// the limit" when only some of its values are there), else the wrong-arity error.
    #[cold]
    #[inline(never)]
    pub fn needs(&self, option: &[u8], what: &str) -> RedisError {
        let option = self.doc().and_then(|doc| Some((doc, doc.option(option)?)));
        match option {
            Some((doc, opt)) => RedisError::String(format!(
                "ERR {} needs {what}: {}. Usage: {}",
                opt.token
                    .map_or_else(String::new, |t| t.to_string_lossy().into_owned()),
                opt.form(),
                self.usage(doc)
            )),
            None => self.wrong_arity(),
        }
    }

    /// The error for the argument just read, which is not an integer.
    #[cold]
    #[inline(never)]
    pub fn not_an_integer(&self) -> RedisError {
        self.not_an_integer_as(None)
    }

    /// The next argument as a signed 64-bit integer named `name` in the error (for arguments
    /// whose position alone does not say which they are: `amount [amount ...]`).
    pub fn next_i64_as(&mut self, name: &str) -> Result<i64, RedisError> {
        let bytes = self.next_bytes()?;
        match parse_canonical_i64(bytes) {
            Some(n) => Ok(n),
            None => Err(self.not_an_integer_as(Some(name))),
        }
    }

    /// The error for the argument just read, not an integer: named `name`, else by its position
    /// or the option before it.
    #[cold]
    #[inline(never)]
    pub fn not_an_integer_as(&self, name: Option<&str>) -> RedisError {
        // Its index in argv (the cursor has moved past it).
        let at = self.pos.saturating_sub(1);
        let got = self.all.get(at).map_or(&b""[..], |a| a.as_slice());
        let got_text = printable_id(got);
        let Some(doc) = self.doc() else {
            return RedisError::String(format!("{NOT_AN_INTEGER}: '{got_text}'"));
        };
        let usage = self.usage(doc);
        let hint = self
            .key_as_option(doc)
            .map_or_else(String::new, |h| format!(" ({h})"));
        // The value of the option just before it (not the key: index 1), else a positional.
        let option = at
            .checked_sub(1)
            .filter(|&i| i >= 2 && name.is_none())
            .and_then(|i| self.all.get(i))
            .and_then(|t| doc.option(t.as_slice()))
            .and_then(|o| o.token);
        if let Some(token) = option {
            return RedisError::String(format!(
                "ERR value of {} is not an integer or out of range: got '{got_text}'{hint}. Usage: {usage}",
                token.to_string_lossy()
            ));
        }
        let named = name.map(str::to_owned).or_else(|| {
            at.checked_sub(1)
                .and_then(|i| doc.positional(i))
                .map(|arg| arg.placeholder())
        });
        match named {
            Some(name) => {
                let why = if doc.option(got).is_some() {
                    format!(", an option: {name} comes before the options")
                } else {
                    String::new()
                };
                RedisError::String(format!(
                    "ERR {name} is not an integer or out of range: got '{got_text}'{why}{hint}. Usage: {usage}"
                ))
            }
            None => RedisError::String(format!(
                "{NOT_AN_INTEGER}: got '{got_text}'{hint}. Usage: {usage}"
            )),
        }
    }

    /// When the key is one of the command's option keywords (`QUOTA.SET LIMIT 10 b:1`), the
    /// likely cause of any error: says so.
    fn key_as_option(&self, doc: &CommandDoc) -> Option<String> {
        let key = self.all.get(1)?.as_slice();
        doc.option(key)?;
        Some(format!(
            "the key was taken to be '{}': the key comes first",
            printable_id(key)
        ))
    }
}

/// A reservation TTL outside `1..=`[`MAX_TTL_MS`] given as the `TTL` option (QUOTA.SET,
/// QUOTA.RESERVE, QUOTA.MRESERVE); the text spells the bound (a `&'static str` cannot format).
pub const BAD_TTL: &str = "ERR TTL must be positive and at most 1000000000000000 ms";
/// The same for the `ttl_ms` argument (QUOTA.EXTEND, QUOTA.MEXTEND).
pub const BAD_TTL_MS: &str = "ERR ttl_ms must be positive and at most 1000000000000000 ms";

/// `ttl` if it is a reservation TTL (`1..=`[`MAX_TTL_MS`] ms), else `error`: checked while
/// parsing, so that the error names no key and a call denied anyway still gets it.
pub fn ttl_arg(ttl: i64, error: &'static str) -> Result<i64, RedisError> {
    if (1..=MAX_TTL_MS).contains(&ttl) {
        Ok(ttl)
    } else {
        Err(RedisError::Str(error))
    }
}

/// Parses a decimal i64 as Redis does (`string2ll`): optional `-`, then `0` alone or a first
/// digit 1–9; no spaces, no `+`, no leading zeros, no `-0`. So `007` is refused as `INCRBY x 007`
/// is, and every accepted number has one spelling.
pub fn parse_i64(bytes: &[u8]) -> Result<i64, RedisError> {
    parse_canonical_i64(bytes).ok_or(RedisError::Str(NOT_AN_INTEGER))
}

/// One pass over the digits (every command parses integers: no UTF-8 check, no second scan).
/// Accumulates negatively so that `i64::MIN` parses without overflow.
pub fn parse_canonical_i64(bytes: &[u8]) -> Option<i64> {
    let (negative, digits) = match bytes.strip_prefix(b"-") {
        Some(rest) => (true, rest),
        None => (false, bytes),
    };
    match digits {
        [b'0'] if !negative => return Some(0),
        [b'1'..=b'9', ..] => {}
        _ => return None,
    }
    let mut n: i64 = 0;
    for &d in digits {
        let digit = i64::from(d.wrapping_sub(b'0'));
        if !(0..=9).contains(&digit) {
            return None;
        }
        n = n.checked_mul(10)?.checked_sub(digit)?;
    }
    if negative {
        Some(n)
    } else {
        n.checked_neg()
    }
}

/// An id argument: 1..=`max_len` bytes.
pub fn check_id(id: &[u8], max_len: i64) -> Result<(), RedisError> {
    if id.is_empty() {
        return Err(RedisError::Str("ERR id must not be empty"));
    }
    if i64::try_from(id.len()).unwrap_or(i64::MAX) > max_len {
        return Err(RedisError::String(format!(
            "ERR id is longer than {max_len} bytes"
        )));
    }
    Ok(())
}

/// A syntax error naming the unexpected token (printable, bounded).
pub fn syntax_error(token: &[u8]) -> RedisError {
    RedisError::String(format!(
        "ERR syntax error near '{}'",
        crate::core::error::printable_id(token)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_errors_spell_the_bound() {
        for e in [BAD_TTL, BAD_TTL_MS] {
            assert!(e.ends_with(&format!(" {MAX_TTL_MS} ms")), "{e}");
        }
        assert_eq!(ttl_arg(MAX_TTL_MS, BAD_TTL).ok(), Some(MAX_TTL_MS));
        assert_eq!(ttl_arg(1, BAD_TTL).ok(), Some(1));
        for bad in [0, -1, MAX_TTL_MS + 1, i64::MIN] {
            assert!(ttl_arg(bad, BAD_TTL_MS).is_err(), "{bad}");
        }
    }

    #[test]
    fn integers_parse_as_redis_does() {
        for (text, want) in [
            ("0", Some(0)),
            ("7", Some(7)),
            ("-7", Some(-7)),
            ("9223372036854775807", Some(i64::MAX)),
            ("-9223372036854775808", Some(i64::MIN)),
            ("9223372036854775808", None),
            ("007", None),
            ("-0", None),
            ("-007", None),
            ("+1", None),
            ("", None),
            ("-", None),
            (" 1", None),
            ("1 ", None),
            ("1.5", None),
            ("1e3", None),
            ("10", Some(10)),
            ("-9223372036854775809", None),
            ("99999999999999999999", None),
            ("1-", None),
            ("--1", None),
            ("1/", None),
            ("1:", None),
        ] {
            assert_eq!(parse_i64(text.as_bytes()).ok(), want, "{text:?}");
        }
    }

    proptest::proptest! {
        /// Accepted exactly when the text is the number's one decimal spelling.
        #[test]
        fn integers_have_one_spelling(n in proptest::num::i64::ANY, text in "-?[0-9]{0,21}") {
            proptest::prop_assert_eq!(parse_canonical_i64(n.to_string().as_bytes()), Some(n));
            let want = text.parse::<i64>().ok().filter(|v| v.to_string() == text);
            proptest::prop_assert_eq!(parse_canonical_i64(text.as_bytes()), want);
        }
    }
}
