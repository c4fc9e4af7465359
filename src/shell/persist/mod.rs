//! The persisted encoding of module values: the only place that knows bincode.
//!
//! A value is saved as one RDB string buffer: bincode 1.3.3 (`DefaultOptions`: varint,
//! little-endian, trailing bytes rejected) of a versioned plain struct. The RDB encoding version
//! (`encver`) says which struct a buffer holds; every older version keeps a decoder here.
//! bincode is pinned (`=1.3.3`, format frozen, RUSTSEC-2025-0141 "unmaintained"): swapping it
//! means a new encver with a new decoder, nothing else.
//!
//! Decoding never trusts the bytes: bincode reads no further than the buffer (and at most
//! 1 GiB, `MAX_BUFFER`), serde pre-allocates a sequence only cautiously (a claimed length
//! allocates little until its elements are actually read), and the decoded value must pass its
//! invariants before it is accepted.

pub mod budget;
pub mod window;

use bincode::Options;

pub use budget::{decode_budget, encode_budget, BUDGET_ENCVER};
pub use window::{decode_window, encode_window, WINDOW_ENCVER};

/// Largest value buffer accepted (1 GiB): bounds allocation on corrupt input.
const MAX_BUFFER: u64 = 1 << 30;

/// Why a buffer was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    UnknownVersion(i32),
    Malformed(String),
    Invalid(String),
}

impl DecodeError {
    /// A decoded value that breaks an invariant; the core's error code (`ERR `) is dropped, as
    /// the reply that carries this error has its own.
    pub fn invalid(e: impl std::fmt::Display) -> DecodeError {
        let msg = e.to_string();
        DecodeError::Invalid(msg.strip_prefix("ERR ").unwrap_or(&msg).to_string())
    }

    /// A bincode failure. A check of ours run while decoding (a window's buckets) reports
    /// through serde with its `ERR ` text: that value is inconsistent, not malformed.
    pub fn from_bincode(e: bincode::Error) -> DecodeError {
        match *e {
            bincode::ErrorKind::Custom(ref msg) if msg.starts_with("ERR ") => {
                DecodeError::invalid(msg)
            }
            // Its message is empty.
            bincode::ErrorKind::Io(ref io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
                DecodeError::Malformed("the payload ends early".to_string())
            }
            _ => DecodeError::Malformed(e.to_string()),
        }
    }
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::UnknownVersion(v) => write!(f, "unknown encoding version {v}"),
            DecodeError::Malformed(e) => write!(f, "malformed payload: {e}"),
            DecodeError::Invalid(e) => write!(f, "inconsistent payload: {e}"),
        }
    }
}

/// The bincode options every encoding uses (a 1 GiB limit on what one decode reads).
pub(crate) fn options() -> impl Options {
    bincode::DefaultOptions::new().with_limit(MAX_BUFFER)
}
