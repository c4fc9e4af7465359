//! Corrupt data never crashes: RESTORE of truncated, bit-flipped and length-inflated DUMP
//! payloads of budget (`rq-budget`) and window (`rq-window`) keys.
//!
//! A DUMP payload is `object type (7 = module v2) · module id (0x81 + 8 bytes, encodes the
//! type name and encver) · opcode 5 (string) · RDB length · value bytes · opcode 0 (EOF) ·
//! RDB version (2 bytes LE) · CRC64 (8 bytes LE)` (the server runs with `rdbcompression no`, so
//! the value is a plain string). Redis checks the CRC before anything else; this test recomputes
//! it after every mutation (Redis's CRC64: Jones polynomial, reflected, init 0, checked on a real
//! DUMP first), so the corrupt bytes reach the module's `rdb_load` and its decoder.
//!
//! Every attempt must be answered with an error (Redis's "Bad data format" after the module
//! refused the value), or, for a mutation that happens to encode a valid value, create a key
//! that passes the ledger invariants (budgets) or answers QUOTA.WINDOW (windows) and accepts
//! further writes. The server must stay up, log no panic, and `used_memory` must not grow by
//! 50 MB (an inflated length must not allocate it).

mod common;
mod reliability;

use common::*;
use reliability::{budget_snapshot, info_field};

/// Redis's CRC64 (crc64-jones: polynomial 0xad93d23594c935a9, reflected in and out, init 0,
/// no final xor), bit by bit.
fn crc64(data: &[u8]) -> u64 {
    // 0xad93d23594c935a9 with its bits reversed.
    const POLY: u64 = 0x95ac_9329_ac4b_c9b5;
    let mut crc = 0u64;
    for &byte in data {
        crc ^= u64::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// An RDB length (`rdbSaveLen`): 6-bit, 14-bit, 32-bit or 64-bit big-endian.
fn rdb_len(n: u64) -> Vec<u8> {
    if n < 1 << 6 {
        vec![n as u8]
    } else if n < 1 << 14 {
        vec![0x40 | (n >> 8) as u8, n as u8]
    } else if n <= u64::from(u32::MAX) {
        let mut v = vec![0x80];
        v.extend_from_slice(&(n as u32).to_be_bytes());
        v
    } else {
        let mut v = vec![0x81];
        v.extend_from_slice(&n.to_be_bytes());
        v
    }
}

/// Reads an RDB length at `bytes[0..]`: (value, bytes used).
fn read_rdb_len(bytes: &[u8]) -> (u64, usize) {
    match bytes[0] >> 6 {
        0 => (u64::from(bytes[0] & 0x3f), 1),
        1 => ((u64::from(bytes[0] & 0x3f) << 8) | u64::from(bytes[1]), 2),
        2 if bytes[0] == 0x80 => (
            u64::from(u32::from_be_bytes(bytes[1..5].try_into().unwrap())),
            5,
        ),
        2 if bytes[0] == 0x81 => (u64::from_be_bytes(bytes[1..9].try_into().unwrap()), 9),
        _ => panic!(
            "special string encoding {:#x}: is rdbcompression off?",
            bytes[0]
        ),
    }
}

/// A parsed DUMP payload of a module value.
struct Dump {
    /// `07 81 <module id>` : type and module id, 10 bytes.
    head: Vec<u8>,
    /// The module's value bytes (the bincode of the value).
    value: Vec<u8>,
    /// RDB version, 2 bytes.
    version: [u8; 2],
}

impl Dump {
    fn parse(payload: &[u8]) -> Dump {
        let n = payload.len();
        assert!(n > 10, "payload too short");
        let crc = u64::from_le_bytes(payload[n - 8..].try_into().unwrap());
        assert_eq!(
            crc64(&payload[..n - 8]),
            crc,
            "CRC64 does not match Redis's"
        );
        let body = &payload[..n - 10];
        assert_eq!(body[0], 7, "object type: module value v2");
        assert_eq!(body[1], 0x81, "module id: 64-bit length");
        assert_eq!(body[10], 5, "module opcode: string");
        let (len, used) = read_rdb_len(&body[11..]);
        let start = 11 + used;
        let end = start + usize::try_from(len).unwrap();
        assert_eq!(body[end..], [0], "module EOF opcode ends the body");
        Dump {
            head: body[..10].to_vec(),
            value: body[start..end].to_vec(),
            version: payload[n - 10..n - 8].try_into().unwrap(),
        }
    }

    /// The body (everything before version and CRC) with `value` and a declared length.
    fn body(&self, value: &[u8], declared_len: u64) -> Vec<u8> {
        let mut b = self.head.clone();
        b.push(5);
        b.extend(rdb_len(declared_len));
        b.extend_from_slice(value);
        b.push(0);
        b
    }

    /// A payload for `body`: version and a CRC that matches.
    fn seal(&self, body: &[u8]) -> Vec<u8> {
        let mut p = body.to_vec();
        p.extend_from_slice(&self.version);
        let crc = crc64(&p);
        p.extend_from_slice(&crc.to_le_bytes());
        p
    }

    /// Every mutation of this dump, each a sealed payload.
    fn mutations(&self) -> Vec<Vec<u8>> {
        let value_len = self.value.len() as u64;
        let body = self.body(&self.value, value_len);
        let mut out = Vec::new();
        // The whole body truncated at every length.
        for cut in 0..body.len() {
            out.push(self.seal(&body[..cut]));
        }
        // Every bit of the body flipped (type, module id and encver, opcodes, lengths, value).
        for i in 0..body.len() {
            for bit in 0..8 {
                let mut b = body.clone();
                b[i] ^= 1 << bit;
                out.push(self.seal(&b));
            }
        }
        // The value truncated at every length, with a matching RDB length: only the module sees it.
        for cut in 0..self.value.len() {
            out.push(self.seal(&self.body(&self.value[..cut], cut as u64)));
        }
        // The RDB string length inflated (Redis reads past the end).
        for declared in [
            value_len + 1,
            value_len + 1000,
            1 << 20,
            1 << 31,
            u64::from(u32::MAX),
            1 << 40,
            1 << 62,
            u64::MAX,
        ] {
            out.push(self.seal(&self.body(&self.value, declared)));
        }
        // Inside the value: each byte replaced by a huge bincode varint (0xfc u32 / 0xfd u64),
        // so a length or count read there is inflated; each byte set to 0x00 and to 0xff.
        for i in 0..self.value.len() {
            let mut varints: Vec<Vec<u8>> = vec![
                [&[0xfc][..], &u32::MAX.to_le_bytes()].concat(),
                [&[0xfd][..], &u64::MAX.to_le_bytes()].concat(),
                [&[0xfd][..], &(1u64 << 40).to_le_bytes()].concat(),
                [&[0xfd][..], &(1u64 << 31).to_le_bytes()].concat(),
            ];
            varints.push(vec![0x00]);
            varints.push(vec![0xff]);
            for v in varints {
                let mut value = self.value.clone();
                value.splice(i..i + 1, v);
                out.push(self.seal(&self.body(&value, value.len() as u64)));
            }
        }
        out
    }
}

#[test]
fn crc64_is_redis_crc64() {
    // The check value of crc-64-jones (Redis's src/crc64.c test: "123456789").
    assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
}

/// Makes the keys whose dumps get mutated: budgets with pending, finished, generated and custom
/// ids, binary ids, a period; windows with one and with many buckets.
fn make_keys(c: &mut redis::Connection) -> Vec<&'static str> {
    ok(
        c,
        &[
            "QUOTA.SET",
            "b:plain",
            "LIMIT",
            "100000",
            "OVERDRAFT",
            "10",
            "MAXRESERVE",
            "5000",
            "TTL",
            "600000",
        ],
    );
    for amount in ["100", "200", "300"] {
        ok(c, &["QUOTA.RESERVE", "b:plain", amount]);
    }
    ok(c, &["QUOTA.RESERVE", "b:plain", "40", "ID", "a\x01\u{7f}b"]);
    ok(c, &["QUOTA.RESERVE", "b:plain", "50", "ID", "settled"]);
    ok(c, &["QUOTA.SETTLE", "b:plain", "settled", "70"]);
    ok(c, &["QUOTA.RESERVE", "b:plain", "60", "ID", "rolled"]);
    ok(c, &["QUOTA.ROLLBACK", "b:plain", "rolled"]);
    ok(c, &["QUOTA.CHARGE", "b:plain", "7", "ID", "c1"]);
    ok(
        c,
        &[
            "QUOTA.SET",
            "b:period",
            "LIMIT",
            "5000",
            "PERIOD",
            "MONTH",
            "TZ",
            "Europe/Paris",
            "ANCHOR",
            "1700000000000",
        ],
    );
    ok(c, &["QUOTA.RESERVE", "b:period", "12", "ID", "p1"]);
    ok(c, &["QUOTA.CHARGE", "b:period", "30"]);
    ok(c, &["QUOTA.WINDOW", "w:one", "10", "60000", "COST", "3"]);
    for i in 0..20 {
        let cost = (i + 1).to_string();
        ok(
            c,
            &[
                "QUOTA.WINDOW",
                "w:many",
                "100000",
                "4000",
                "COST",
                &cost,
                "PRECISION",
                "1",
            ],
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // Window keys expire when their history does (4 s here): keep them for the whole test.
    ok(c, &["PERSIST", "w:one"]);
    ok(c, &["PERSIST", "w:many"]);
    vec!["b:plain", "b:period", "w:one", "w:many"]
}

#[test]
fn corrupt_restore_payloads_are_refused_without_crash_or_huge_allocation() {
    let mut s = Server::start(&["--rdbcompression", "no"]);
    let mut c = s.conn();
    let keys = make_keys(&mut c);
    let baseline = info_field(&mut c, "memory", "used_memory");
    let (mut attempts, mut refused, mut accepted) = (0usize, 0usize, 0usize);
    let mut messages = std::collections::BTreeSet::new();
    let started = std::time::Instant::now();
    for key in &keys {
        let payload: Vec<u8> = redis::cmd("DUMP").arg(*key).query(&mut c).unwrap();
        assert!(!payload.is_empty(), "{key}: no such key");
        let dump = Dump::parse(&payload);
        // The unmodified dump, resealed, restores to the same value.
        let resealed = dump.seal(&dump.body(&dump.value, dump.value.len() as u64));
        assert_eq!(resealed, payload, "{key}: parse and seal are exact");
        let mutations = dump.mutations();
        for (chunk_no, chunk) in mutations.chunks(256).enumerate() {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for (i, p) in chunk.iter().enumerate() {
                pipe.cmd("RESTORE")
                    .arg(format!("r:{i}"))
                    .arg(0)
                    .arg(p.as_slice())
                    .arg("REPLACE");
            }
            let replies: Vec<Value> = pipe.query(&mut c).unwrap();
            for (i, reply) in replies.iter().enumerate() {
                attempts += 1;
                match reply {
                    Value::ServerError(e) => {
                        refused += 1;
                        assert_eq!(e.code(), "ERR", "{key} mutation {i}: {e}");
                        messages.insert(e.details().unwrap_or("").to_string());
                    }
                    Value::Okay => {
                        accepted += 1;
                        check_restored(&mut c, &format!("r:{i}"), key);
                    }
                    other => panic!("{key} mutation {i}: unexpected reply {other:?}"),
                }
            }
            let _: Vec<Value> = {
                let mut del = redis::pipe();
                for i in 0..chunk.len() {
                    del.cmd("DEL").arg(format!("r:{i}"));
                }
                del.query(&mut c).unwrap()
            };
            let used = info_field(&mut c, "memory", "used_memory");
            assert!(
                used < baseline + 50_000_000,
                "{key} chunk {chunk_no}: used_memory {used} vs {baseline} before"
            );
        }
    }
    assert!(s.alive(), "server died; log:\n{}", s.log());
    assert_eq!(ok(&mut c, &["PING"]), Value::SimpleString("PONG".into()));
    let log = s.log();
    assert!(!log.contains("PANIC"), "panic in the log:\n{log}");
    // The CRC was right every time: Redis never refused a payload before the module saw it.
    assert!(
        !messages.iter().any(|m| m.contains("checksum")),
        "{messages:?}"
    );
    // The module's own decoders refused values (not only Redis's framing).
    assert!(
        log.contains("rq-budget: refusing value"),
        "no budget refusal logged"
    );
    assert!(
        log.contains("rq-window: refusing value"),
        "no window refusal logged"
    );
    // One refusal warning per second and type at most, however many RESTOREs are refused
    // (each still got its error reply above).
    let warnings = log
        .lines()
        .filter(|l| l.contains(": refusing value"))
        .count();
    let seconds = usize::try_from(started.elapsed().as_secs()).unwrap();
    assert!(
        warnings <= 2 * (seconds + 2),
        "{warnings} refusal warnings in {seconds} s for {refused} refusals"
    );
    assert!(attempts > 5_000, "{attempts} attempts");
    assert!(refused > attempts / 2, "{refused} of {attempts} refused");
    eprintln!(
        "{attempts} corrupt RESTOREs: {refused} refused, {accepted} accepted as valid values; \
         errors: {messages:?}"
    );
    // The original keys are untouched.
    for key in &keys {
        let payload: Vec<u8> = redis::cmd("DUMP").arg(*key).query(&mut c).unwrap();
        Dump::parse(&payload);
    }
    let used = info_field(&mut c, "memory", "used_memory");
    assert!(
        used < baseline + 50_000_000,
        "used_memory {used} vs {baseline}"
    );
}

/// A mutated payload that was accepted must be a sound value of some type of ours.
fn check_restored(c: &mut redis::Connection, key: &str, from: &str) {
    let kind: String = redis::cmd("TYPE").arg(key).query(c).unwrap();
    match kind.as_str() {
        "rq-budget" => {
            budget_snapshot(c, key.as_bytes())
                .unwrap_or_else(|e| panic!("{key} (from {from}): {e}"))
                .expect("a budget");
            // It takes writes and stays sound.
            let _ = q(c, &["QUOTA.RESERVE", key, "1"]);
            let _ = q(c, &["QUOTA.CHARGE", key, "1", "FORCE"]);
            budget_snapshot(c, key.as_bytes())
                .unwrap_or_else(|e| panic!("{key} (from {from}) after writes: {e}"));
        }
        "rq-window" => {
            let r = ok(c, &["QUOTA.WINDOW", key, "1000000", "60000", "PEEK"]);
            let r = items(&r);
            assert_eq!(r.len(), 4, "{key} (from {from})");
            assert!(int(&r[1]) >= 0, "{key} (from {from}): {r:?}");
            let _ = q(c, &["QUOTA.WINDOW", key, "1000000", "60000"]);
        }
        other => panic!("{key} (from {from}) restored as type {other}"),
    }
    // Its own dump restores again (the value re-encodes).
    let again: Vec<u8> = redis::cmd("DUMP").arg(key).query(c).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("r:again")
        .arg(0)
        .arg(again)
        .arg("REPLACE")
        .query(c)
        .unwrap();
    ok(c, &["DEL", "r:again"]);
}
