//! Bad input: wrong arity, non-numbers, negatives, huge numbers, 1 MB ids, binary key names,
//! wrong types. Each gets the right coded error, the key is unchanged, and the server lives.
// Tests may panic: the no-panic lints guard the module code only.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::panic
)]

mod common;
use common::*;

fn q_bytes(c: &mut redis::Connection, args: &[&[u8]]) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(c)
}

#[test]
fn every_bad_argument_gets_a_coded_error_and_changes_nothing() {
    let mut s = Server::start(&[]);
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "1000"]);
    ok(&mut c, &["QUOTA.RESERVE", "t", "10", "ID", "p"]);
    let before = digest(&mut c, "t");
    let huge = "9".repeat(40);
    let max = i64::MAX.to_string();
    let min = i64::MIN.to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["QUOTA.SET"], "ERR"),
        (vec!["QUOTA.SET", "t", "LIMIT"], "ERR"),
        (vec!["QUOTA.SET", "t", "LIMIT", "x"], "ERR"),
        (vec!["QUOTA.SET", "t", "LIMIT", "-1"], "ERR"),
        (vec!["QUOTA.SET", "t", "LIMIT", &huge], "ERR"),
        (vec!["QUOTA.SET", "t", "TTL", "0"], "ERR"),
        (vec!["QUOTA.SET", "t", "MAXRESERVE", "-2"], "ERR"),
        (vec!["QUOTA.SET", "t", "BOGUS", "1"], "ERR"),
        (vec!["QUOTA.SET", "t", "USED", &max], "ERR"),
        (vec!["QUOTA.INFO"], "ERR"),
        (vec!["QUOTA.INFO", "t", "extra"], "ERR"),
        (vec!["QUOTA.RESERVE", "t"], "ERR"),
        (vec!["QUOTA.RESERVE", "t", "1.5"], "ERR"),
        (vec!["QUOTA.RESERVE", "t", " 1"], "ERR"),
        (vec!["QUOTA.RESERVE", "t", "+1"], "ERR"),
        (vec!["QUOTA.RESERVE", "t", "-1"], "ERR"),
        (vec!["QUOTA.RESERVE", "t", &min], "ERR"),
        (vec!["QUOTA.RESERVE", "t", &huge], "ERR"),
        (vec!["QUOTA.RESERVE", "t", "1", "ID"], "ERR"),
        (vec!["QUOTA.RESERVE", "t", "1", "ID", ""], "ERR"),
        (vec!["QUOTA.RESERVE", "t", "1", "TTL", "-5"], "ERR"),
        (
            vec!["QUOTA.RESERVE", "t", "1", "TTL", &max, "ID", "x"],
            "ERR",
        ),
        (vec!["QUOTA.RESERVE", "t", "1", "NOPE"], "ERR"),
        (vec!["QUOTA.SETTLE", "t", "p"], "ERR"),
        (vec!["QUOTA.SETTLE", "t", "p", "-3"], "ERR"),
        (vec!["QUOTA.SETTLE", "t", "p", "x"], "ERR"),
        (vec!["QUOTA.SETTLE", "t", "p", "1", "junk"], "ERR"),
        (vec!["QUOTA.ROLLBACK", "t"], "ERR"),
        (vec!["QUOTA.EXTEND", "t", "p"], "ERR"),
        (vec!["QUOTA.EXTEND", "t", "p", "-1"], "ERR"),
        (vec!["QUOTA.EXTEND", "t", "p", &max], "ERR"),
        (vec!["QUOTA.CHARGE", "t"], "ERR"),
        (vec!["QUOTA.CHARGE", "t", "-1"], "ERR"),
        (vec!["QUOTA.CHARGE", "t", &max, "FORCE"], "ERR"),
        (vec!["QUOTA.CHARGE", "t", "1", "FORCEX"], "ERR"),
        (vec!["QUOTA.PENDING", "t", "COUNT"], "ERR"),
        (vec!["QUOTA.PENDING", "t", "COUNT", &huge], "ERR"),
        (vec!["QUOTA.RESERVE", "t", &max], "TOOLARGE_OR_DENY"),
    ];
    for (args, code) in &cases {
        match q(&mut c, args) {
            Err(e) => {
                if *code != "TOOLARGE_OR_DENY" {
                    assert_eq!(e.code().unwrap_or(""), *code, "{args:?}: {e}");
                }
            }
            Ok(v) => {
                // Only a denial is an acceptable non-error here.
                assert_eq!(*code, "TOOLARGE_OR_DENY", "{args:?} should fail, got {v:?}");
                assert_eq!(int(&items(&v)[0]), 0);
            }
        }
        assert_eq!(digest(&mut c, "t"), before, "{args:?} changed the key");
    }
    // A 1 MB id is refused by length, not stored.
    let big_id = vec![b'x'; 1 << 20];
    let e = q_bytes(&mut c, &[b"QUOTA.RESERVE", b"t", b"1", b"ID", &big_id]).unwrap_err();
    assert_eq!(e.code(), Some("ERR"));
    assert!(e.to_string().contains("longer than 128"), "{e}");
    let e = q_bytes(&mut c, &[b"QUOTA.SETTLE", b"t", &big_id, b"1"]).unwrap_err();
    assert_eq!(e.code(), Some("ERR"));
    assert_eq!(digest(&mut c, "t"), before);
    // Binary key names and ids (NUL, CR/LF, invalid UTF-8) work and error lines stay valid.
    let key: &[u8] = b"k\x00\r\n\xff";
    let id: &[u8] = b"i\x00\r\n\xfe";
    q_bytes(&mut c, &[b"QUOTA.SET", key, b"LIMIT", b"5"]).unwrap();
    let r = q_bytes(&mut c, &[b"QUOTA.RESERVE", key, b"2", b"ID", id]).unwrap();
    assert_eq!(items(&r)[1], Value::BulkString(id.to_vec()));
    let e = q_bytes(&mut c, &[b"QUOTA.RESERVE", key, b"3", b"ID", id]).unwrap_err();
    assert_eq!(e.code(), Some("CONFLICT"));
    let e = q_bytes(&mut c, &[b"QUOTA.SETTLE", key, b"\r\nnope\x00", b"1"]).unwrap_err();
    assert_eq!(e.code(), Some("NORESERVATION"));
    assert!(s.alive(), "server died; log:\n{}", s.log());
    assert_eq!(ok(&mut c, &["PING"]), Value::SimpleString("PONG".into()));
}

#[test]
fn amounts_near_i64_max_never_wrap() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let max = i64::MAX.to_string();
    ok(
        &mut c,
        &["QUOTA.SET", "t", "LIMIT", &max, "OVERDRAFT", &max],
    );
    let r = items(&ok(&mut c, &["QUOTA.RESERVE", "t", &max, "ID", "a"]));
    assert_eq!(int(&r[0]), 1);
    assert_eq!(int(&r[2]), 0);
    // used + reserved would leave i64: refused with ERR, nothing changes.
    let before = digest(&mut c, "t");
    assert_eq!(err(&mut c, &["QUOTA.RESERVE", "t", "1"]).0, "ERR");
    assert_eq!(err(&mut c, &["QUOTA.CHARGE", "t", "1", "FORCE"]).0, "ERR");
    assert_eq!(err(&mut c, &["QUOTA.SET", "t", "USED", "1"]).0, "ERR");
    assert_eq!(digest(&mut c, "t"), before);
    let r = items(&ok(&mut c, &["QUOTA.SETTLE", "t", "a", &max]));
    assert_eq!(text(&r[0]), "settled");
    let i = info(&mut c, "t");
    assert_eq!((i["used"], i["reserved"], i["available"]), (i64::MAX, 0, 0));
    assert_eq!(err(&mut c, &["QUOTA.CHARGE", "t", "1", "FORCE"]).0, "ERR");
}

/// A repeated option keeps its last value; each occurrence's sign is checked, the range only
/// of the value kept (commands.md, Keywords) — QUOTA.WINDOW and QUOTA.PENDING as the budget
/// commands.
#[test]
fn repeated_options_check_each_sign_and_the_kept_range() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let refused = |c: &mut redis::Connection, args: &[&str], message: &str| {
        let (code, msg) = err(c, args);
        assert_eq!(code, "ERR", "{args:?}");
        assert!(msg.contains(message), "{args:?}: {msg}");
    };
    let window = ["QUOTA.WINDOW", "w", "10", "1000"];
    for (options, message) in [
        (["COST", "-1", "COST", "1"], "cost must be non-negative"),
        (
            ["PRECISION", "0", "PRECISION", "10"],
            "precision must be positive",
        ),
        (
            ["PRECISION", "-1", "PRECISION", "10"],
            "precision must be positive",
        ),
    ] {
        refused(&mut c, &[&window[..], &options[..]].concat(), message);
    }
    assert_eq!(ok(&mut c, &["EXISTS", "w"]), Value::Int(0));
    let r = items(&ok(
        &mut c,
        &[&window[..], &["COST", "2", "COST", "1"]].concat(),
    ));
    assert_eq!((int(&r[0]), int(&r[1])), (1, 9));

    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "100"]);
    ok(&mut c, &["QUOTA.RESERVE", "t", "1", "ID", "a"]);
    let r = items(&ok(
        &mut c,
        &["QUOTA.PENDING", "t", "COUNT", "10001", "COUNT", "5"],
    ));
    assert_eq!(r.len(), 1);
    for counts in [["-1", "5"], ["5", "10001"]] {
        let args = ["QUOTA.PENDING", "t", "COUNT", counts[0], "COUNT", counts[1]];
        refused(&mut c, &args, "COUNT must be between 0 and 10000");
    }
}
