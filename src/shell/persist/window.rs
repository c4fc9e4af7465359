//! Sliding-window values (`rq-window`): encoding versions and their decoders.
//!
//! Version 1 is bincode (see [`super::options`]) of [`Window`]'s serialized fields: the core
//! declares their order to be the wire format (`window_ms, precision_ms, horizon_ms, last_ms,
//! buckets: [(index, count)]`). Version 2 (issue 19) is [`WindowV2`]: those same fields, then
//! the stored configuration and the remembered ids of multi-key reservations. The golden tests
//! below pin both: if `Window`'s serialized fields ever change, keep a frozen mirror here for
//! the old decoders and add encver 3.

use bincode::Options;

use super::{options, DecodeError};
use crate::core::remembered::{Entry, IdStatus, Remembered};
use crate::core::window::{Window, WindowConfig};

/// Encoding version of window values written by this build.
pub const WINDOW_ENCVER: i32 = 2;

/// Version 2: the v1 fields, the configuration, the ids in bucket order (then arrival).
#[derive(serde::Serialize, serde::Deserialize)]
struct WindowV2 {
    window: Window,
    /// `(limit, window_ms, precision_ms)`.
    config: Option<(i64, i64, i64)>,
    ids: Vec<IdV2>,
}

/// One remembered id: bytes, bucket index, counted, status code (0 pending, 1 settled, 2
/// rolled back).
#[derive(serde::Serialize, serde::Deserialize)]
struct IdV2(Vec<u8>, i64, i64, u8);

/// Encodes a window at the current encoding version.
pub fn encode_window(w: &Window) -> Vec<u8> {
    let v2 = WindowV2 {
        window: w.clone(),
        config: w.config().map(|c| (c.limit, c.window_ms, c.precision_ms)),
        ids: w
            .remembered()
            .iter()
            .map(|(id, e)| IdV2(id.to_vec(), e.index, e.counted, e.status.code()))
            .collect(),
    };
    // Plain integers and bounded sequences: cannot exceed the limit; an empty buffer would
    // fail loudly on load rather than panic here.
    options().serialize(&v2).unwrap_or_default()
}

/// Decodes a window written at encoding version `encver`; the value must pass
/// [`Window::validate`].
pub fn decode_window(encver: i32, bytes: &[u8]) -> Result<Window, DecodeError> {
    match encver {
        1 => decode_v1(bytes),
        2 => decode_v2(bytes),
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

fn decode_v2(bytes: &[u8]) -> Result<Window, DecodeError> {
    let v2: WindowV2 = options()
        .deserialize(bytes)
        .map_err(DecodeError::from_bincode)?;
    let config = match v2.config {
        Some((limit, window_ms, precision_ms)) => Some(
            WindowConfig::parse(limit, window_ms, Some(precision_ms))
                .map_err(DecodeError::invalid)?,
        ),
        None => None,
    };
    let mut ids = Remembered::default();
    let mut previous: Option<i64> = None;
    for IdV2(id, index, counted, code) in v2.ids {
        // In bucket order, each id once: the one order encoding writes.
        if previous.is_some_and(|p| p > index) || ids.get(&id).is_some() {
            return Err(DecodeError::invalid(
                "remembered ids out of order or repeated",
            ));
        }
        let status = IdStatus::from_code(code)
            .ok_or_else(|| DecodeError::invalid("remembered id status"))?;
        ids.put(
            &id,
            Entry {
                index,
                counted,
                status,
            },
        )
        .map_err(|_| DecodeError::invalid("remembered id bucket index"))?;
        previous = Some(index);
    }
    let w = v2.window.with_extras(config, ids);
    w.validate().map_err(DecodeError::invalid)?;
    Ok(w)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::core::window::WindowParams;

    /// The version 1 bytes of a window (its serialized fields alone).
    fn encode_v1(w: &Window) -> Vec<u8> {
        options().serialize(w).unwrap()
    }

    const V1_GOLDEN: [u8; 23] = [
        0xfb, 0xd0, 0x07, 0x14, 0xfb, 0xd0, 0x07, 0xfb, 0xde, 0x2e, 0x03, 0xfb, 0xe8, 0x03, 0x0c,
        0xfb, 0x06, 0x04, 0x06, 0xfb, 0xae, 0x04, 0x06,
    ];

    /// A configured window holding two remembered ids (one pending, one settled).
    fn sample_v2() -> Window {
        use crate::core::window::{WindowConfig, WindowEffect};
        let mut w = sample();
        let cfg = WindowConfig::parse(100, 1000, Some(10)).unwrap();
        w.apply(6_000, &WindowEffect::Configure(cfg)).unwrap();
        for (id, cost) in [(&b"a"[..], 5), (b"b", 7)] {
            w.apply(
                6_001,
                &WindowEffect::Count {
                    window_ms: 1000,
                    precision_ms: 10,
                    cost,
                    id: Some(id.into()),
                },
            )
            .unwrap();
        }
        w.apply(
            6_002,
            &WindowEffect::Settle {
                id: b"b"[..].into(),
                actual: 3,
            },
        )
        .unwrap();
        w
    }

    #[test]
    fn version_2_round_trips_and_its_bytes_are_frozen() {
        let w = sample_v2();
        let bytes = encode_window(&w);
        let back = decode_window(2, &bytes).unwrap();
        assert_eq!(back, w);
        assert_eq!(back.remembered().len(), 2);
        // After the v1 fields: Some((100, 1000, 10)), then 2 ids (bytes, index 600, counted,
        // status): ("a", 600, 5, pending), ("b", 600, 3, settled).
        let tail: &[u8] = &[
            0x01, 0xc8, 0xfb, 0xd0, 0x07, 0x14, 0x02, 0x01, 0x61, 0xfb, 0xb0, 0x04, 0x0a, 0x00,
            0x01, 0x62, 0xfb, 0xb0, 0x04, 0x06, 0x01,
        ];
        assert!(bytes.ends_with(tail), "{bytes:02x?}");
        for cut in 0..bytes.len() {
            assert!(
                decode_window(2, &bytes[..cut]).is_err(),
                "truncated at {cut}"
            );
        }
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                if let Ok(v) = decode_window(2, &b) {
                    v.validate().unwrap();
                }
            }
        }
    }

    /// An id whose bucket index the remembered ids cannot hold (outside ±2^61) is refused by
    /// the decoder, not wrapped (its window check would refuse it too, later).
    #[test]
    fn an_id_index_far_outside_is_refused() {
        let w = sample_v2();
        for index in [1i64 << 62, i64::MAX, i64::MIN, -(1i64 << 61) - 1] {
            let v2 = WindowV2 {
                window: w.clone(),
                config: Some((100, 1000, 10)),
                ids: vec![IdV2(b"a".to_vec(), index, 1, 0)],
            };
            let bytes = options().serialize(&v2).unwrap();
            assert_eq!(
                decode_window(2, &bytes).unwrap_err().to_string(),
                "inconsistent payload: remembered id bucket index",
                "{index}"
            );
        }
    }

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
        assert_eq!(bytes[..23], V1_GOLDEN[..], "v2 starts with the v1 fields");
        assert_eq!(back, w);
        assert_eq!(encode_window(&back), bytes);
    }

    /// Pins the version 1 wire format: a change here orphans saved RDBs and AOFs.
    #[test]
    fn version_1_bytes_are_frozen() {
        let bytes = encode_v1(&sample());
        assert_eq!(decode_window(1, &bytes).unwrap(), sample());
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
            decode_window(1, &encode_v1(&sample())[..5])
                .unwrap_err()
                .to_string(),
            "malformed payload: the payload ends early"
        );
    }

    #[test]
    fn corrupt_payloads_are_refused_not_panicking() {
        let bytes = encode_v1(&sample());
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
            decode_window(3, &bytes).unwrap_err(),
            DecodeError::UnknownVersion(3)
        );
        // A huge bucket count must not allocate it.
        let mut huge = bytes[..11].to_vec();
        huge.extend([0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
        assert!(decode_window(1, &huge).is_err());
    }
}
