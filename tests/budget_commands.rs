//! Integration: every budget command, reply shape and error, through redis-rs, RESP2 and RESP3.
//! Time is driven with `AT` (quota.test-clock yes) where it matters.

mod common;
use common::*;

/// A server driven by `AT`. Its sweeper is off: the sweeper judges expiry by the wall clock,
/// far ahead of these AT times, and would race the commands under test.
fn clock_server() -> Server {
    Server::start_with_module_args(&[], &["test-clock", "yes", "sweep-effort", "0"])
}

#[test]
fn set_info_reserve_settle_round_trip() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(int(&ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "1000"])), 1);
    assert_eq!(int(&ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "1200"])), 0);
    let r = items(&ok(&mut c, &["QUOTA.RESERVE", "t", "300"]));
    assert_eq!(int(&r[0]), 1);
    let id = text(&r[1]);
    assert!(id.contains('-'), "stream-style id, got {id}");
    assert_eq!(int(&r[2]), 900);
    assert_eq!(int(&r[3]), 0);
    let st = items(&ok(&mut c, &["QUOTA.SETTLE", "t", &id, "250"]));
    assert_eq!(text(&st[0]), "settled");
    assert_eq!(int(&st[1]), 250);
    assert_eq!(int(&st[2]), 950);
    let i = info(&mut c, "t");
    assert_eq!(i["limit"], 1200);
    assert_eq!(i["used"], 250);
    assert_eq!(i["reserved"], 0);
    assert_eq!(i["available"], 950);
    assert_eq!(i["overdraft"], 0);
    assert_eq!(i["max_reserve"], -1);
    assert_eq!(i["default_ttl_ms"], 3_600_000);
    assert_eq!(i["pending"], 0);
    assert_eq!(i["overrun"], 0);
    assert_eq!(ok(&mut c, &["QUOTA.INFO", "missing"]), Value::Nil);
}

/// A QUOTA.SET that changes nothing (no options, or the values the key has) writes nothing to
/// the AOF (nor, so, to the replication stream) and does not touch the key for WATCH; one that
/// changes a value does.
#[test]
fn set_with_nothing_to_change_writes_nothing() {
    // `always`: each write reaches the file before the reply (with `everysec` Redis may hold the
    // buffer back while a background fsync runs, and the size would lag).
    let s = Server::start(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "k", "LIMIT", "10", "TTL", "5000"]);
    let aof = |c: &mut redis::Connection| info_section(c, "persistence")["aof_current_size"];
    let before = aof(&mut c);
    assert!(before > 0);
    assert_eq!(int(&ok(&mut c, &["QUOTA.SET", "k"])), 0);
    assert_eq!(
        int(&ok(
            &mut c,
            &["QUOTA.SET", "k", "LIMIT", "10", "TTL", "5000"]
        )),
        0
    );
    assert_eq!(aof(&mut c), before);
    // Nor does it touch the key for WATCH.
    assert!(untouched(&mut c, "k", |c| {
        ok(c, &["QUOTA.SET", "k", "LIMIT", "10"]);
    }));
    assert_eq!(int(&ok(&mut c, &["QUOTA.SET", "k", "LIMIT", "11"])), 0);
    assert!(aof(&mut c) > before);
    assert_eq!(info(&mut c, "k")["limit"], 11);
}

#[test]
fn set_options_nx_xx_used_overdraft_maxreserve_ttl() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(
        int(&ok(&mut c, &["QUOTA.SET", "k", "LIMIT", "10", "XX"])),
        0
    );
    assert_eq!(keys(&mut c), Vec::<String>::new());
    let (code, _) = err(&mut c, &["QUOTA.SET", "k", "USED", "3"]);
    assert_eq!(code, "ERR");
    assert_eq!(
        int(&ok(
            &mut c,
            &[
                "QUOTA.SET",
                "k",
                "LIMIT",
                "100",
                "USED",
                "40",
                "OVERDRAFT",
                "5",
                "MAXRESERVE",
                "50",
                "TTL",
                "1000",
                "NX"
            ]
        )),
        1
    );
    assert_eq!(int(&ok(&mut c, &["QUOTA.SET", "k", "LIMIT", "1", "NX"])), 0);
    let i = info(&mut c, "k");
    assert_eq!(
        (
            i["limit"],
            i["used"],
            i["overdraft"],
            i["max_reserve"],
            i["default_ttl_ms"]
        ),
        (100, 40, 5, 50, 1000)
    );
    // MAXRESERVE → TOOLARGE, and nothing changes.
    let (code, _) = err(&mut c, &["QUOTA.RESERVE", "k", "51"]);
    assert_eq!(code, "TOOLARGE");
    assert_eq!(info(&mut c, "k")["reserved"], 0);
    // Overdraft: available 60, overdraft 5 → 50 + 15 fits (65 ≤ 65), then 1 more does not.
    assert_eq!(
        int(&items(&ok(&mut c, &["QUOTA.RESERVE", "k", "50"]))[0]),
        1
    );
    assert_eq!(
        int(&items(&ok(&mut c, &["QUOTA.RESERVE", "k", "15"]))[0]),
        1
    );
    let d = items(&ok(&mut c, &["QUOTA.RESERVE", "k", "1"]));
    assert_eq!(
        (int(&d[0]), d[1].clone(), int(&d[2]), int(&d[3])),
        (0, Value::Nil, -5, -1)
    );
    // An update keeps pending reservations; USED overwrites used; MAXRESERVE -1 clears the cap.
    assert_eq!(
        int(&ok(
            &mut c,
            &["QUOTA.SET", "k", "USED", "0", "MAXRESERVE", "-1", "XX"]
        )),
        0
    );
    let i = info(&mut c, "k");
    assert_eq!(
        (
            i["used"],
            i["reserved"],
            i["pending"],
            i["available"],
            i["max_reserve"]
        ),
        (0, 65, 2, 35, -1)
    );
    let (code, _) = err(&mut c, &["QUOTA.SET", "k", "NX", "XX"]);
    assert_eq!(code, "ERR");
}

#[test]
fn reserve_with_id_is_idempotent_and_conflicts_on_reuse() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "100"]);
    let a = items(&ok(&mut c, &["QUOTA.RESERVE", "t", "30", "ID", "req-1"]));
    assert_eq!(
        (int(&a[0]), text(&a[1]), int(&a[2])),
        (1, "req-1".into(), 70)
    );
    // A retry with the same amount answers as the grant and reserves nothing more.
    let b = items(&ok(&mut c, &["QUOTA.RESERVE", "t", "30", "ID", "req-1"]));
    assert_eq!(
        (int(&b[0]), text(&b[1]), int(&b[2])),
        (1, "req-1".into(), 70)
    );
    assert_eq!(info(&mut c, "t")["reserved"], 30);
    let (code, msg) = err(&mut c, &["QUOTA.RESERVE", "t", "31", "ID", "req-1"]);
    assert_eq!(code, "CONFLICT");
    assert!(msg.contains("pending"), "{msg}");
    ok(&mut c, &["QUOTA.SETTLE", "t", "req-1", "10"]);
    let (code, msg) = err(&mut c, &["QUOTA.RESERVE", "t", "30", "ID", "req-1"]);
    assert_eq!(code, "CONFLICT");
    assert!(msg.contains("settled"), "{msg}");
}

#[test]
fn settle_statuses_and_errors() {
    let s = clock_server();
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "1000", "AT", "1000"]);
    ok_line(&mut c, "QUOTA.RESERVE t 100 ID a TTL 500 AT 1000");
    // Overrun: settle beyond the reservation is charged and counted.
    let r = items(&ok(
        &mut c,
        &["QUOTA.SETTLE", "t", "a", "130", "AT", "1100"],
    ));
    assert_eq!(
        (text(&r[0]), int(&r[1]), int(&r[2])),
        ("settled".into(), 130, 870)
    );
    assert_eq!(info(&mut c, "t")["overrun"], 30);
    let r = items(&ok(
        &mut c,
        &["QUOTA.SETTLE", "t", "a", "130", "AT", "1200"],
    ));
    assert_eq!(
        (text(&r[0]), int(&r[1]), int(&r[2])),
        ("duplicate".into(), 130, 870)
    );
    assert_eq!(
        err(&mut c, &["QUOTA.SETTLE", "t", "a", "131", "AT", "1200"]).0,
        "CONFLICT"
    );
    assert_eq!(
        err(&mut c, &["QUOTA.SETTLE", "t", "nope", "1", "AT", "1200"]).0,
        "NORESERVATION"
    );
    // Late: the reservation expired (released) but the call happened.
    ok_line(&mut c, "QUOTA.RESERVE t 100 ID b TTL 500 AT 2000");
    assert_eq!(info_at(&mut c, "t", 2100)["reserved"], 100);
    let r = items(&ok(&mut c, &["QUOTA.SETTLE", "t", "b", "40", "AT", "2500"]));
    assert_eq!(
        (text(&r[0]), int(&r[1]), int(&r[2])),
        ("late".into(), 40, 830)
    );
    let i = info_at(&mut c, "t", 2500);
    assert_eq!((i["used"], i["reserved"], i["pending"]), (170, 0, 0));
    // Settling a rolled-back id conflicts.
    ok(
        &mut c,
        &["QUOTA.RESERVE", "t", "10", "ID", "c", "AT", "3000"],
    );
    ok(&mut c, &["QUOTA.ROLLBACK", "t", "c", "AT", "3000"]);
    let (code, msg) = err(&mut c, &["QUOTA.SETTLE", "t", "c", "1", "AT", "3000"]);
    assert_eq!(code, "CONFLICT");
    assert!(msg.contains("rolledback"), "{msg}");
}

#[test]
fn rollback_statuses_and_errors() {
    let s = clock_server();
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "100", "AT", "0"]);
    ok(&mut c, &["QUOTA.RESERVE", "t", "40", "ID", "a", "AT", "0"]);
    let r = items(&ok(&mut c, &["QUOTA.ROLLBACK", "t", "a", "AT", "1"]));
    assert_eq!(
        (text(&r[0]), int(&r[1]), int(&r[2])),
        ("rolledback".into(), 40, 100)
    );
    let r = items(&ok(&mut c, &["QUOTA.ROLLBACK", "t", "a", "AT", "2"]));
    assert_eq!(
        (text(&r[0]), int(&r[1]), int(&r[2])),
        ("duplicate".into(), 0, 100)
    );
    ok_line(&mut c, "QUOTA.RESERVE t 40 ID e TTL 10 AT 10");
    let r = items(&ok(&mut c, &["QUOTA.ROLLBACK", "t", "e", "AT", "20"]));
    assert_eq!(
        (text(&r[0]), int(&r[1]), int(&r[2])),
        ("expired".into(), 0, 100)
    );
    ok(&mut c, &["QUOTA.RESERVE", "t", "40", "ID", "s", "AT", "30"]);
    ok(&mut c, &["QUOTA.SETTLE", "t", "s", "40", "AT", "30"]);
    let (code, msg) = err(&mut c, &["QUOTA.ROLLBACK", "t", "s", "AT", "31"]);
    assert_eq!(code, "CONFLICT");
    assert!(msg.contains("settled"), "{msg}");
    assert_eq!(
        err(&mut c, &["QUOTA.ROLLBACK", "t", "zz", "AT", "31"]).0,
        "NORESERVATION"
    );
    assert_eq!(info(&mut c, "t")["used"], 40);
}

#[test]
fn extend_keeps_a_long_call_alive() {
    let s = clock_server();
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "100", "AT", "0"]);
    ok_line(&mut c, "QUOTA.RESERVE t 40 ID a TTL 100 AT 0");
    assert_eq!(
        int(&ok(&mut c, &["QUOTA.EXTEND", "t", "a", "100", "AT", "90"])),
        100
    );
    // Without the heartbeat it would have expired at 100; now at 189.
    let p = items(&ok(&mut c, &["QUOTA.PENDING", "t", "AT", "150"]));
    let e = items(&p[0]);
    assert_eq!(
        (text(&e[0]), int(&e[1]), int(&e[2]), int(&e[3])),
        ("a".into(), 40, 150, 40)
    );
    assert_eq!(
        text(&items(&ok(&mut c, &["QUOTA.SETTLE", "t", "a", "40", "AT", "189"]))[0]),
        "settled"
    );
    assert_eq!(
        err(&mut c, &["QUOTA.EXTEND", "t", "a", "100", "AT", "190"]).0,
        "CONFLICT"
    );
    assert_eq!(
        err(&mut c, &["QUOTA.EXTEND", "t", "b", "100", "AT", "190"]).0,
        "NORESERVATION"
    );
    ok_line(&mut c, "QUOTA.RESERVE t 1 ID x TTL 10 AT 200");
    assert_eq!(
        err(&mut c, &["QUOTA.EXTEND", "t", "x", "100", "AT", "210"]).0,
        "CONFLICT"
    );
    assert_eq!(
        err(&mut c, &["QUOTA.EXTEND", "t", "x", "0", "AT", "205"]).0,
        "ERR"
    );
}

#[test]
fn charge_one_phase_force_and_idempotent_id() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    ok(
        &mut c,
        &["QUOTA.SET", "t", "LIMIT", "100", "MAXRESERVE", "80"],
    );
    let r = items(&ok(&mut c, &["QUOTA.CHARGE", "t", "60", "ID", "c1"]));
    assert_eq!((int(&r[0]), int(&r[1]), int(&r[2])), (1, 40, 0));
    let r = items(&ok(&mut c, &["QUOTA.CHARGE", "t", "60", "ID", "c1"]));
    assert_eq!(
        (int(&r[0]), int(&r[1]), int(&r[2])),
        (1, 40, 0),
        "answered from memory"
    );
    assert_eq!(info(&mut c, "t")["used"], 60);
    let r = items(&ok(&mut c, &["QUOTA.CHARGE", "t", "50"]));
    assert_eq!((int(&r[0]), int(&r[1]), int(&r[2])), (0, 40, -1));
    assert_eq!(err(&mut c, &["QUOTA.CHARGE", "t", "81"]).0, "TOOLARGE");
    // FORCE: usage reported after the fact is always charged; beyond available is overrun.
    let r = items(&ok(&mut c, &["QUOTA.CHARGE", "t", "50", "FORCE"]));
    assert_eq!((int(&r[0]), int(&r[1])), (1, -10));
    let i = info(&mut c, "t");
    assert_eq!((i["used"], i["overrun"], i["available"]), (110, 10, -10));
    assert_eq!(
        err(&mut c, &["QUOTA.CHARGE", "t", "5", "ID", "c1"]).0,
        "CONFLICT"
    );
    // The overrun total is a sum like any other: refused when it would leave the i64 range
    // (it used to stop at the maximum silently, dropping what came after).
    ok(&mut c, &["QUOTA.SET", "ov", "LIMIT", "0"]);
    ok(
        &mut c,
        &["QUOTA.CHARGE", "ov", "9223372036854775807", "FORCE"],
    );
    ok(&mut c, &["QUOTA.SET", "ov", "USED", "0"]);
    let (code, msg) = err(&mut c, &["QUOTA.CHARGE", "ov", "5", "FORCE"]);
    assert_eq!(code, "ERR");
    assert!(msg.contains("out of range"), "{msg}");
    let i = info(&mut c, "ov");
    assert_eq!((i["used"], i["overrun"]), (0, i64::MAX));
}

#[test]
fn pending_lists_soonest_expiry_first_and_caps_count() {
    let s = clock_server();
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "100", "AT", "0"]);
    ok_line(&mut c, "QUOTA.RESERVE t 1 ID late TTL 300 AT 0");
    ok_line(&mut c, "QUOTA.RESERVE t 2 ID soon TTL 100 AT 0");
    ok_line(&mut c, "QUOTA.RESERVE t 3 ID mid TTL 200 AT 0");
    let p = items(&ok(&mut c, &["QUOTA.PENDING", "t", "AT", "50"]));
    let ids: Vec<String> = p.iter().map(|e| text(&items(e)[0])).collect();
    assert_eq!(ids, ["soon", "mid", "late"]);
    let p = items(&ok(
        &mut c,
        &["QUOTA.PENDING", "t", "COUNT", "1", "AT", "150"],
    ));
    assert_eq!(p.len(), 1);
    assert_eq!(text(&items(&p[0])[0]), "mid");
    assert_eq!(items(&ok(&mut c, &["QUOTA.PENDING", "nokey"])).len(), 0);
    assert_eq!(
        err(&mut c, &["QUOTA.PENDING", "t", "COUNT", "10001"]).0,
        "ERR"
    );
    assert_eq!(err(&mut c, &["QUOTA.PENDING", "t", "COUNT", "-1"]).0, "ERR");
}

#[test]
fn expired_reservations_are_released_for_reads_and_decisions() {
    let s = clock_server();
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "100", "AT", "0"]);
    ok_line(&mut c, "QUOTA.RESERVE t 100 ID a TTL 50 AT 0");
    assert_eq!(
        int(&items(&ok(&mut c, &["QUOTA.RESERVE", "t", "1", "AT", "49"]))[0]),
        0
    );
    // At the deadline the reservation is released, before any write happened.
    let i = info_at(&mut c, "t", 50);
    assert_eq!((i["reserved"], i["available"], i["pending"]), (0, 100, 0));
    assert_eq!(
        int(&items(&ok(&mut c, &["QUOTA.RESERVE", "t", "100", "AT", "50"]))[0]),
        1
    );
}

#[test]
fn finished_ids_are_forgotten_after_finished_ttl() {
    let s = Server::start_with_module_args(
        &[],
        &[
            "test-clock",
            "yes",
            "finished-ttl",
            "1000",
            "sweep-effort",
            "0",
        ],
    );
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "100", "AT", "0"]);
    ok(&mut c, &["QUOTA.RESERVE", "t", "10", "ID", "a", "AT", "0"]);
    ok(&mut c, &["QUOTA.SETTLE", "t", "a", "10", "AT", "100"]);
    assert_eq!(
        text(&items(&ok(&mut c, &["QUOTA.SETTLE", "t", "a", "10", "AT", "1099"]))[0]),
        "duplicate"
    );
    assert_eq!(
        err(&mut c, &["QUOTA.SETTLE", "t", "a", "10", "AT", "1100"]).0,
        "NORESERVATION"
    );
    // A forgotten id can be used again.
    assert_eq!(
        int(&items(&ok(
            &mut c,
            &["QUOTA.RESERVE", "t", "10", "ID", "a", "AT", "1100"]
        ))[0]),
        1
    );
    assert_eq!(info(&mut c, "t")["used"], 10);
}

#[test]
fn at_requires_test_clock() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "100"]);
    let (code, msg) = err(&mut c, &["QUOTA.RESERVE", "t", "1", "AT", "5"]);
    assert_eq!(code, "ERR");
    assert!(msg.contains("test-clock"), "{msg}");
}

#[test]
fn internal_commands_are_refused_from_clients() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "100"]);
    let (code, msg) = err(&mut c, &["QUOTA.APPLY", "t", "1", "CHARGE", "5", "0"]);
    assert_eq!(code, "ERR");
    assert!(msg.contains("internal"), "{msg}");
    assert_eq!(err(&mut c, &["QUOTA.LOAD", "t", "1", "xx"]).0, "ERR");
    assert_eq!(info(&mut c, "t")["used"], 0);
}

#[test]
fn resp3_replies_are_maps_and_arrays() {
    let s = Server::start(&[]);
    let mut c = s.conn3();
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "10"]);
    match ok(&mut c, &["QUOTA.INFO", "t"]) {
        Value::Map(m) => {
            assert_eq!(m.len(), 17);
            assert_eq!(text(&m[9].0), "period");
            assert_eq!(text(&m[9].1), "NONE");
            assert_eq!(text(&m[0].0), "limit");
            assert_eq!(m[0].1, Value::Int(10));
        }
        other => panic!("expected a RESP3 map, got {other:?}"),
    }
    let r = items(&ok(&mut c, &["QUOTA.RESERVE", "t", "20"]));
    assert_eq!(
        r,
        vec![Value::Int(0), Value::Nil, Value::Int(10), Value::Int(-1)]
    );
    let r = items(&ok(&mut c, &["QUOTA.RESERVE", "t", "2", "ID", "x"]));
    let st = items(&ok(&mut c, &["QUOTA.SETTLE", "t", "x", "2"]));
    assert_eq!(text(&r[1]), "x");
    assert_eq!(st[0], Value::SimpleString("settled".into()));
}

#[test]
fn wrongtype_and_noquota() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    ok(&mut c, &["SET", "str", "x"]);
    for cmd in [
        vec!["QUOTA.INFO", "str"],
        vec!["QUOTA.SET", "str", "LIMIT", "1"],
        vec!["QUOTA.RESERVE", "str", "1"],
        vec!["QUOTA.SETTLE", "str", "a", "1"],
        vec!["QUOTA.ROLLBACK", "str", "a"],
        vec!["QUOTA.EXTEND", "str", "a", "1"],
        vec!["QUOTA.CHARGE", "str", "1"],
        vec!["QUOTA.PENDING", "str"],
    ] {
        assert_eq!(err(&mut c, &cmd).0, "WRONGTYPE", "{cmd:?}");
    }
    ok(&mut c, &["QUOTA.SET", "b", "LIMIT", "1"]);
    assert_eq!(err(&mut c, &["GET", "b"]).0, "WRONGTYPE");
    for cmd in [
        vec!["QUOTA.RESERVE", "none", "1"],
        vec!["QUOTA.SETTLE", "none", "a", "1"],
        vec!["QUOTA.ROLLBACK", "none", "a"],
        vec!["QUOTA.EXTEND", "none", "a", "1"],
        vec!["QUOTA.CHARGE", "none", "1"],
    ] {
        assert_eq!(err(&mut c, &cmd).0, "NOQUOTA", "{cmd:?}");
    }
    assert_eq!(ok(&mut c, &["EXISTS", "none"]), Value::Int(0));
}

#[test]
fn command_key_positions_route_in_cluster() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for cmd in [
        "QUOTA.SET",
        "QUOTA.RESERVE",
        "QUOTA.SETTLE",
        "QUOTA.INFO",
        "QUOTA.CHARGE",
        "QUOTA.PENDING",
        "QUOTA.ROLLBACK",
        "QUOTA.EXTEND",
    ] {
        let keys: Vec<String> = redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg(cmd)
            .arg("tenant:{a}")
            .arg("1")
            .arg("2")
            .query(&mut c)
            .unwrap();
        assert_eq!(keys, vec!["tenant:{a}".to_string()], "{cmd}");
    }
}

/// The module opens each key once and signals it modified only when a call wrote something
/// (`REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED`): WATCH sees every change and nothing
/// else.
#[test]
fn watch_sees_every_change_and_nothing_else() {
    let s = clock_server();
    let mut c = s.conn();
    let at = |d: i64| (1_700_000_000_000i64 + d).to_string();
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "100", "AT", &at(0)]);
    let touched = |c: &mut redis::Connection, args: &[&str]| {
        !untouched(c, "t", |c| {
            let _: redis::RedisResult<Value> = redis::cmd(args[0]).arg(&args[1..]).query(c);
        })
    };
    // Writes.
    assert!(touched(
        &mut c,
        &["QUOTA.RESERVE", "t", "10", "ID", "a", "AT", &at(1)]
    ));
    assert!(touched(
        &mut c,
        &["QUOTA.RESERVE", "t", "10", "ID", "b", "AT", &at(1)]
    ));
    assert!(touched(
        &mut c,
        &["QUOTA.RESERVE", "t", "10", "ID", "e", "AT", &at(1)]
    ));
    assert!(touched(
        &mut c,
        &["QUOTA.SETTLE", "t", "a", "5", "AT", &at(2)]
    ));
    assert!(touched(&mut c, &["QUOTA.ROLLBACK", "t", "b", "AT", &at(2)]));
    assert!(touched(
        &mut c,
        &["QUOTA.EXTEND", "t", "e", "1000", "AT", &at(2)]
    ));
    assert!(touched(&mut c, &["QUOTA.CHARGE", "t", "3", "AT", &at(3)]));
    assert!(touched(
        &mut c,
        &["QUOTA.SET", "t", "LIMIT", "200", "AT", &at(3)]
    ));
    // Denials, retries, duplicates, errors and reads write nothing.
    let before = digest(&mut c, "t");
    for args in [
        vec!["QUOTA.RESERVE", "t", "1000", "AT", &at(4)],
        vec!["QUOTA.RESERVE", "t", "10", "ID", "e", "AT", &at(4)],
        vec!["QUOTA.RESERVE", "t", "10", "ID", "a", "AT", &at(4)],
        vec!["QUOTA.RESERVE", "t", "-1", "AT", &at(4)],
        vec!["QUOTA.SETTLE", "t", "a", "5", "AT", &at(4)],
        vec!["QUOTA.SETTLE", "t", "nope", "5", "AT", &at(4)],
        vec!["QUOTA.ROLLBACK", "t", "b", "AT", &at(4)],
        vec!["QUOTA.CHARGE", "t", "1000", "AT", &at(4)],
        vec!["QUOTA.INFO", "t", "AT", &at(4)],
        vec!["QUOTA.PENDING", "t", "AT", &at(4)],
        vec!["QUOTA.SET", "t", "NX", "LIMIT", "5", "AT", &at(4)],
    ] {
        assert!(!touched(&mut c, &args), "{args:?}");
    }
    assert_eq!(digest(&mut c, "t"), before);
    // The sweeper's releases are changes too (wall clock: a real 50 ms reservation).
    let w = Server::start(&[]);
    let mut c = w.conn();
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "100"]);
    ok(&mut c, &["QUOTA.RESERVE", "t", "10", "TTL", "50"]);
    assert!(!untouched(&mut c, "t", |c| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while info_section(c, "quota")["quota_sweeper_released"] == 0 {
            assert!(std::time::Instant::now() < deadline, "sweeper did not run");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }));
    assert_eq!(info(&mut c, "t")["pending"], 0);
}
