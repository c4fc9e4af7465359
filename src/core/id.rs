//! Generated reservation ids: stream-style `<ms>-<seq>` (the Redis Streams id scheme).
//!
//! A new id is strictly greater than every stream-style id the key has seen, and its `ms` part
//! follows the master's clock, so a new master after failover (whose clock is past the old
//! master's) does not re-issue an id that was handed out but lost in the async replication window.

/// A parsed `<ms>-<seq>` id. Ordering is numeric: `ms` first, then `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct StreamId {
    pub ms: u64,
    pub seq: u64,
}

impl StreamId {
    pub const ZERO: StreamId = StreamId { ms: 0, seq: 0 };

    /// The next id at `now_ms`: `(now, 0)` if the clock moved past the last id, else
    /// `(last.ms, last.seq + 1)`, or `(last.ms + 1, 0)` when the sequence is exhausted (as
    /// Redis Streams' XADD does; a client id `<ms>-18446744073709551615` must not block id
    /// generation). `None` only at `u64::MAX-u64::MAX`.
    pub fn next(&self, now_ms: i64) -> Option<StreamId> {
        let now = u64::try_from(now_ms).unwrap_or(0);
        if now > self.ms {
            Some(StreamId { ms: now, seq: 0 })
        } else {
            match self.seq.checked_add(1) {
                Some(seq) => Some(StreamId { ms: self.ms, seq }),
                None => Some(StreamId {
                    ms: self.ms.checked_add(1)?,
                    seq: 0,
                }),
            }
        }
    }

    /// Parses the canonical form only (decimal digits, no sign, no leading zeros), so that each
    /// id has one spelling and a parsed id always renders back to the same bytes.
    pub fn parse(bytes: &[u8]) -> Option<StreamId> {
        let dash = bytes.iter().position(|b| *b == b'-')?;
        let (ms, seq) = bytes.split_at(dash);
        Some(StreamId {
            ms: canonical_u64(ms)?,
            seq: canonical_u64(seq.get(1..)?)?,
        })
    }

    /// The canonical `<ms>-<seq>` spelling (at most 41 bytes; inline up to 24).
    pub fn to_bytes(self) -> crate::core::book::Id {
        let mut buf = [0u8; 41];
        let mut len = 0usize;
        let mut put = |text: &[u8]| {
            let end = len.saturating_add(text.len());
            if let Some(dst) = buf.get_mut(len..end) {
                dst.copy_from_slice(text);
                len = end;
            }
        };
        put(itoa::Buffer::new().format(self.ms).as_bytes());
        put(b"-");
        put(itoa::Buffer::new().format(self.seq).as_bytes());
        crate::core::book::Id::from_slice(buf.get(..len).unwrap_or(&[]))
    }
}

/// The stream-style reading of the last id parsed through it: a multi-key reservation grants
/// one id on every budget, and each budget's [`crate::core::ledger::Budget::apply_seen`] reads
/// it, so it is parsed once per command instead of once per key. Ids longer than
/// [`ParsedId::KEPT`] bytes are parsed every time (never a generated one).
#[derive(Debug, Default)]
pub struct ParsedId {
    len: usize,
    bytes: [u8; ParsedId::KEPT],
    parsed: Option<StreamId>,
}

impl ParsedId {
    /// Longest id kept (a generated id has at most 20 + 1 + 20 digits and dash, mostly 15).
    pub const KEPT: usize = 24;

    /// [`StreamId::parse`] of `bytes`, from the last call if it had the same bytes.
    pub fn parse(&mut self, bytes: &[u8]) -> Option<StreamId> {
        if self.len != 0 && self.bytes.get(..self.len) == Some(bytes) {
            return self.parsed;
        }
        let parsed = StreamId::parse(bytes);
        if let Some(kept) = self.bytes.get_mut(..bytes.len()) {
            kept.copy_from_slice(bytes);
            self.len = bytes.len();
            self.parsed = parsed;
        }
        parsed
    }
}

/// `id`'s two digit runs if it is a stream-style id in canonical form (`<ms>-<seq>`, decimal
/// digits without leading zeros, any length): ids whose numeric order is the order of the
/// (length, bytes) of each run, and whose bytes are equal iff their values are.
pub(crate) fn stream_parts(id: &[u8]) -> Option<(&[u8], &[u8])> {
    let (ms, seq) = dash_parts(id)?;
    // Without early exits (the bytes are few): a loop the compiler can unroll and vectorize.
    let digits = |d: &[u8]| {
        matches!(d, [_] | [b'1'..=b'9', _, ..])
            && d.iter().fold(true, |all, b| all & b.is_ascii_digit())
    };
    (digits(ms) && digits(seq)).then_some((ms, seq))
}

/// `id` split at its first dash, unchecked. Ordered by [`stream_cmp`], such pairs are equal
/// iff their ids are; among stream-style ids that order is the numeric one. So a lookup among
/// stream-style ids needs no check of its id: one that is not stream-style is found nowhere
/// (a window key's ordered form, `crate::core::remembered`).
pub(crate) fn dash_parts(id: &[u8]) -> Option<(&[u8], &[u8])> {
    let dash = id.iter().position(|&b| b == b'-')?;
    let (ms, rest) = id.split_at(dash);
    Some((ms, rest.get(1..)?))
}

/// The numeric order of two stream-style ids' [`stream_parts`] (any [`dash_parts`]: a total
/// order, equal iff the ids are).
pub(crate) fn stream_cmp(a: (&[u8], &[u8]), b: (&[u8], &[u8])) -> std::cmp::Ordering {
    a.0.len()
        .cmp(&b.0.len())
        .then_with(|| a.0.cmp(b.0))
        .then_with(|| a.1.len().cmp(&b.1.len()))
        .then_with(|| a.1.cmp(b.1))
}

fn canonical_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 20 || (digits.len() > 1 && digits.first() == Some(&b'0'))
    {
        return None;
    }
    let mut n: u64 = 0;
    for &d in digits {
        let digit = u64::from(d.wrapping_sub(b'0'));
        if digit > 9 {
            return None;
        }
        // Up to 19 digits cannot overflow (10^19 - 1 < u64::MAX): plain arithmetic, exact.
        // Applied to every generated id a grant stores, so the usual case stays cheap.
        n = if digits.len() < 20 {
            n.wrapping_mul(10).wrapping_add(digit)
        } else {
            n.checked_mul(10)?.checked_add(digit)?
        };
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The canonical spelling by way of the standard library: what `parse` must agree with.
    fn reference(bytes: &[u8]) -> Option<StreamId> {
        let (ms, seq) = std::str::from_utf8(bytes).ok()?.split_once('-')?;
        let canonical = |t: &str| t.parse::<u64>().ok().filter(|n| n.to_string() == t);
        Some(StreamId {
            ms: canonical(ms)?,
            seq: canonical(seq)?,
        })
    }

    proptest! {
        #[test]
        fn parse_agrees_with_reference(
            // Mostly digits, so that one dash, leading zeros and 20-digit parts are common.
            bytes in proptest::collection::vec(
                prop_oneof![
                    12 => prop::sample::select(b"0123456789".to_vec()),
                    1 => prop::sample::select(b"-+ a\xff".to_vec()),
                ],
                0..45,
            ),
        ) {
            prop_assert_eq!(StreamId::parse(&bytes), reference(&bytes));
        }

        /// Through one `ParsedId`, ids (often the same again, some longer than it keeps) read
        /// as `StreamId::parse` reads each.
        #[test]
        fn parsed_id_agrees_with_parse(
            ids in proptest::collection::vec(
                prop_oneof![
                    3 => Just(b"1800000000000-7".to_vec()),
                    1 => Just(b"1800000000000-8".to_vec()),
                    1 => Just(b"18446744073709551615-18446744073709551615".to_vec()),
                    1 => Just(Vec::new()),
                    2 => proptest::collection::vec(
                        prop::sample::select(b"0123456789-x".to_vec()), 0..30),
                ],
                1..20,
            ),
        ) {
            let mut memo = ParsedId::default();
            for id in &ids {
                prop_assert_eq!(memo.parse(id), StreamId::parse(id));
            }
        }

        #[test]
        fn parse_reads_back_any_id(ms in any::<u64>(), seq in any::<u64>()) {
            let id = StreamId { ms, seq };
            prop_assert_eq!(StreamId::parse(&id.to_bytes()), Some(id));
        }
    }

    #[test]
    fn next_follows_clock_then_sequence() {
        let a = StreamId::ZERO.next(1000).unwrap();
        assert_eq!(a, StreamId { ms: 1000, seq: 0 });
        let b = a.next(1000).unwrap();
        assert_eq!(b, StreamId { ms: 1000, seq: 1 });
        // Clock behind the last id: keep counting from the last id.
        assert_eq!(b.next(10).unwrap(), StreamId { ms: 1000, seq: 2 });
        assert_eq!(b.next(2000).unwrap(), StreamId { ms: 2000, seq: 0 });
        // An exhausted sequence moves to the next ms (as XADD does).
        assert_eq!(
            StreamId {
                ms: 5,
                seq: u64::MAX
            }
            .next(5),
            Some(StreamId { ms: 6, seq: 0 })
        );
        assert_eq!(
            StreamId {
                ms: u64::MAX,
                seq: u64::MAX
            }
            .next(5),
            None
        );
    }

    #[test]
    fn to_bytes_is_decimal() {
        for ms in [0u64, 1, 9, 10, 99, 100, 1_732_945_523_123, u64::MAX] {
            for seq in [0u64, 7, 10, 12345, u64::MAX] {
                let id = StreamId { ms, seq };
                assert_eq!(&id.to_bytes()[..], format!("{ms}-{seq}").as_bytes());
            }
        }
    }

    #[test]
    fn parse_is_canonical_only() {
        assert_eq!(StreamId::parse(b"12-3"), Some(StreamId { ms: 12, seq: 3 }));
        assert_eq!(StreamId::parse(b"0-0"), Some(StreamId::ZERO));
        for bad in [
            &b"012-3"[..],
            b"12-03",
            b"12",
            b"-3",
            b"12-",
            b"a-1",
            b"1-2-3",
            b"+1-2",
            b"99999999999999999999-1",
            b"18446744073709551616-0",
            b"1-18446744073709551616",
        ] {
            assert_eq!(
                StreamId::parse(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let id = StreamId {
            ms: 1732945523123,
            seq: 7,
        };
        assert_eq!(StreamId::parse(&id.to_bytes()), Some(id));
        // The 19- and 20-digit edges: the largest values and the first ones past them.
        for n in [
            9_999_999_999_999_999_999u64,
            10_000_000_000_000_000_000,
            u64::MAX,
        ] {
            let id = StreamId { ms: n, seq: n };
            assert_eq!(StreamId::parse(&id.to_bytes()), Some(id));
        }
    }
}
