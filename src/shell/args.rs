//! Argument parsing for QUOTA.* commands: a cursor over the command's arguments that yields
//! integers, byte strings and keywords with Redis-style error messages.

use redis_module::{RedisError, RedisString};

/// The standard Redis reply for a bad integer.
pub const NOT_AN_INTEGER: &str = "ERR value is not an integer or out of range";

/// A cursor over a command's arguments (after the command name).
pub struct Args<'a> {
    args: &'a [RedisString],
    pos: usize,
}

impl<'a> Args<'a> {
    /// Arguments after the command name; `WrongArity` if there are fewer than `min`.
    pub fn new(all: &'a [RedisString], min: usize) -> Result<Self, RedisError> {
        let args = all.get(1..).unwrap_or(&[]);
        if args.len() < min {
            return Err(RedisError::WrongArity);
        }
        Ok(Args { args, pos: 0 })
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.args.len()
    }

    /// The next argument as bytes.
    pub fn next_bytes(&mut self) -> Result<&'a [u8], RedisError> {
        let arg = self
            .args
            .get(self.pos)
            .ok_or(RedisError::Str("ERR syntax error: an argument is missing"))?;
        self.pos = self.pos.saturating_add(1);
        Ok(arg.as_slice())
    }

    /// The next argument as the `RedisString` (for keys).
    pub fn next_string(&mut self) -> Result<&'a RedisString, RedisError> {
        let arg = self.args.get(self.pos).ok_or(RedisError::WrongArity)?;
        self.pos = self.pos.saturating_add(1);
        Ok(arg)
    }

    /// The next argument as a signed 64-bit integer.
    pub fn next_i64(&mut self) -> Result<i64, RedisError> {
        parse_i64(self.next_bytes()?)
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

    /// The next argument as a positive integer number of ms named `what`.
    pub fn next_positive(&mut self, what: &str) -> Result<i64, RedisError> {
        let n = self.next_i64()?;
        if n <= 0 {
            return Err(RedisError::String(format!("ERR {what} must be positive")));
        }
        Ok(n)
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
