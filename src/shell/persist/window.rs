//! Sliding-window values (`rq-window`): encoding versions and their decoders.
//!
//! Version 1 is bincode (see [`super::options`]) of [`Window`] itself: the core declares its
//! serialized field order to be the wire format (`window_ms, precision_ms, horizon_ms, last_ms,
//! buckets: [(index, count)]`). The golden test below pins those bytes: if `Window`'s fields
//! ever change, keep a frozen `WindowV1` mirror here for the old decoder and add encver 2.

use bincode::Options;

use super::{options, DecodeError};
use crate::core::window::Window;

/// Encoding version of window values written by this build.
pub const WINDOW_ENCVER: i32 = 1;

/// Encodes a window at the current encoding version.
pub fn encode_window(w: &Window) -> Vec<u8> {
    // Plain integers in a bounded deque (at most 4097 buckets): cannot exceed the limit; an
    // empty buffer would fail loudly on load rather than panic here.
    options().serialize(w).unwrap_or_default()
}

/// Decodes a window written at encoding version `encver`; the value must pass
/// [`Window::validate`].
pub fn decode_window(encver: i32, bytes: &[u8]) -> Result<Window, DecodeError> {
    match encver {
        1 => decode_v1(bytes),
        v => Err(DecodeError::UnknownVersion(v)),
    }
}

fn decode_v1(bytes: &[u8]) -> Result<Window, DecodeError> {
    let w: Window = options()
        .deserialize(bytes)
        .map_err(DecodeError::from_bincode)?;
    w.validate().map_err(DecodeError::invalid)?;
    Ok(w)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::core::window::WindowParams;

    fn sample() -> Window {
        let p = WindowParams::parse(100, 1000, Some(3), Some(10)).unwrap();
        let mut w = Window::new(&p, 5_000);
        for t in [5_000, 5_004, 5_150, 5_999] {
            w.record(&p, t).unwrap();
        }
        w
    }

    #[test]
    fn round_trip_is_exact() {
        let w = sample();
        let bytes = encode_window(&w);
        let back = decode_window(WINDOW_ENCVER, &bytes).unwrap();
        assert_eq!(back, w);
        assert_eq!(encode_window(&back), bytes);
    }

    /// Pins the version 1 wire format: a change here orphans saved RDBs and AOFs.
    #[test]
    fn version_1_bytes_are_frozen() {
        let bytes = encode_window(&sample());
        // bincode DefaultOptions: zigzag varints for i64 (0xfb = u16 follows), plain varint
        // lengths. window_ms 1000, precision_ms 10, horizon_ms 1000, last_ms 5999, then 3
        // buckets (index, count): (500, 6) (515, 3) (599, 3).
        let golden: &[u8] = &[
            0xfb, 0xd0, 0x07, 0x14, 0xfb, 0xd0, 0x07, 0xfb, 0xde, 0x2e, 0x03, 0xfb, 0xe8, 0x03,
            0x0c, 0xfb, 0x06, 0x04, 0x06, 0xfb, 0xae, 0x04, 0x06,
        ];
        assert_eq!(bytes, golden, "{bytes:02x?}");
    }

    /// A check the decoder runs on the buckets (their index span) reports an inconsistent
    /// value with one error code, as the final validation does; a cut payload says so.
    #[test]
    fn refusals_name_their_cause() {
        let mut bytes = vec![
            0xfb, 0xd0, 0x07, 0x14, 0xfb, 0xd0, 0x07, 0xfb, 0xde, 0x2e, 0x02,
        ];
        bytes.extend([0x00, 0x02, 0xfd]); // bucket (0, 1), then index 2^33 (zigzag 2^34)
        bytes.extend((1u64 << 34).to_le_bytes());
        bytes.push(0x02);
        assert_eq!(
            decode_window(1, &bytes).unwrap_err().to_string(),
            "inconsistent payload: corrupt window value: bucket index span"
        );
        assert_eq!(
            decode_window(1, &encode_window(&sample())[..5])
                .unwrap_err()
                .to_string(),
            "malformed payload: the payload ends early"
        );
    }

    #[test]
    fn corrupt_payloads_are_refused_not_panicking() {
        let bytes = encode_window(&sample());
        for cut in 0..bytes.len() {
            assert!(
                decode_window(1, &bytes[..cut]).is_err(),
                "truncated at {cut}"
            );
        }
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                // Must not panic; either refused or a value that passes the invariants.
                if let Ok(v) = decode_window(1, &b) {
                    v.validate().unwrap();
                }
            }
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_window(1, &longer).is_err(), "trailing bytes");
        assert_eq!(
            decode_window(2, &bytes).unwrap_err(),
            DecodeError::UnknownVersion(2)
        );
        // A huge bucket count must not allocate it.
        let mut huge = bytes[..11].to_vec();
        huge.extend([0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
        assert!(decode_window(1, &huge).is_err());
    }
}
