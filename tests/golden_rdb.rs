//! Golden RDB files, one per encoding version, written by earlier builds and committed under
//! tests/fixtures/. A format change that stops old files loading fails here.
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

const AT: &str = "1700000000006";

/// budget-v1.rdb: key `golden` = SET LIMIT 1000 OVERDRAFT 10 MAXRESERVE 500 TTL 60000 at
/// 1700000000000; RESERVE 100 ID a; RESERVE 200 (id 1700000000001-0); RESERVE 50 ID b TTL 1000;
/// SETTLE a 120; CHARGE 7 ID c1; ROLLBACK b (one ms apart each).
#[test]
fn budget_encoding_v1_still_loads() {
    let rdb = include_bytes!("fixtures/budget-v1.rdb");
    // Sweeper off: these 2023 deadlines are long past by the wall clock it uses.
    let s = Server::start_with_files(
        &[],
        &["test-clock", "yes", "sweep-effort", "0"],
        &[("dump.rdb", rdb)],
    );
    let mut c = s.conn();
    let v = ok(&mut c, &["QUOTA.INFO", "golden", "AT", AT]);
    let got: Vec<(String, i64)> = items(&v)
        .chunks(2)
        .filter_map(|p| match p[1] {
            Value::Int(n) => Some((text(&p[0]), n)),
            _ => None,
        })
        .collect();
    let want: Vec<(String, i64)> = [
        ("limit", 1000),
        ("used", 127),
        ("reserved", 200),
        ("available", 673),
        ("overdraft", 10),
        ("max_reserve", 500),
        ("default_ttl_ms", 60000),
        ("pending", 1),
        ("overrun", 20),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), *v))
    .collect();
    assert_eq!(&got[..want.len()], &want[..]);
    let p = items(&ok(&mut c, &["QUOTA.PENDING", "golden", "AT", AT]));
    let e = items(&p[0]);
    assert_eq!(
        (text(&e[0]), int(&e[1]), int(&e[2]), int(&e[3])),
        ("1700000000001-0".into(), 200, 5, 59995)
    );
    // Remembered ids and the id generator survive.
    let r = items(&ok(
        &mut c,
        &["QUOTA.SETTLE", "golden", "a", "120", "AT", AT],
    ));
    assert_eq!(text(&r[0]), "duplicate");
    let r = items(&ok(
        &mut c,
        &["QUOTA.CHARGE", "golden", "7", "ID", "c1", "AT", AT],
    ));
    assert_eq!(int(&r[0]), 1);
    assert_eq!(
        err(&mut c, &["QUOTA.SETTLE", "golden", "b", "1", "AT", AT]).0,
        "CONFLICT"
    );
    let r = items(&ok(
        &mut c,
        &["QUOTA.RESERVE", "golden", "1", "AT", "1700000000001"],
    ));
    // The clock asked for is behind the key's clock: the key's time (last write, ...005) is used.
    assert_eq!(text(&r[1]), "1700000000005-0");
    let r = items(&ok(
        &mut c,
        &["QUOTA.SETTLE", "golden", "1700000000001-0", "150", "AT", AT],
    ));
    assert_eq!((text(&r[0]), int(&r[2])), ("settled".into(), 722));
}
