//! Issue 22: what an expired reservation costs (ONEXPIRE RELEASE|CHARGE|ELAPSED), time budgets
//! measured by the server (UNIT, SETTLE ... ELAPSED, heartbeats in QUOTA.PENDING) and headroom
//! (KEEP). Time is driven with `AT` (quota.test-clock yes) unless a test needs the sweeper.

mod common;
use common::*;
use std::time::{Duration, Instant};

/// 2026-12-01T00:00:00Z.
const T0: i64 = 1_796_083_200_000;
const MIN: i64 = 60_000;

/// A server driven by `AT`, its sweeper off (it judges expiry by the wall clock).
fn clock_server() -> Server {
    Server::start_with_module_args(&[], &["test-clock", "yes", "sweep-effort", "0"])
}

fn at(t: i64) -> String {
    t.to_string()
}

/// `[status, charged, available]` of a SETTLE.
fn settle(c: &mut redis::Connection, key: &str, id: &str, actual: &str, t: i64) -> (String, i64) {
    let v = items(&ok(c, &["QUOTA.SETTLE", key, id, actual, "AT", &at(t)]));
    (text(&v[0]), int(&v[1]))
}

/// The worked example of docs/commands.md: 5 hours a month of an external API, sessions with
/// heartbeats, a crashed client charged up to its last heartbeat.
#[test]
fn time_quota_with_heartbeats_and_a_crashed_client() {
    let s = clock_server();
    let mut c = s.conn();
    ok(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "Kd"]);
    let mut sub = s.conn();
    sub.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut ps = sub.as_pubsub();
    ps.subscribe("__keyspace@0__:api:acme").unwrap();
    #[rustfmt::skip]
    ok(&mut c, &[
        "QUOTA.SET", "api:acme", "LIMIT", "300", "UNIT", "min", "PERIOD", "MONTH",
        "ONEXPIRE", "ELAPSED", "TTL", "300000", "AT", &at(T0),
    ]);
    let fields = ok(&mut c, &["QUOTA.INFO", "api:acme", "AT", &at(T0)]);
    let fields: Vec<String> = items(&fields)
        .iter()
        .map(|v| match v {
            Value::Int(n) => n.to_string(),
            other => text(other),
        })
        .collect();
    assert!(fields.windows(2).any(|w| w == ["on_expire", "ELAPSED"]));
    assert!(fields.windows(2).any(|w| w == ["unit", "min"]));

    // Session 1: heartbeats every 4 minutes, settled by the server's measure: 13.5 min -> 14.
    ok(
        &mut c,
        &["QUOTA.RESERVE", "api:acme", "60", "ID", "s1", "AT", &at(T0)],
    );
    for m in [4, 8, 12] {
        let ttl = int(&ok_line(
            &mut c,
            &format!("QUOTA.EXTEND api:acme s1 300000 AT {}", at(T0 + m * MIN)),
        ));
        assert_eq!(ttl, 300_000);
    }
    let done = T0 + 13 * MIN + 30_000;
    assert_eq!(
        settle(&mut c, "api:acme", "s1", "ELAPSED", done),
        ("settled".into(), 14)
    );
    // A retry, later, answers the first charge.
    assert_eq!(
        settle(&mut c, "api:acme", "s1", "ELAPSED", done + MIN),
        ("duplicate".into(), 14)
    );
    assert_eq!(info_at(&mut c, "api:acme", done)["used"], 14);

    // Session 2: two heartbeats, then the client crashes.
    let s2 = T0 + 20 * MIN;
    ok(
        &mut c,
        &["QUOTA.RESERVE", "api:acme", "60", "ID", "s2", "AT", &at(s2)],
    );
    for m in [4, 8] {
        ok_line(
            &mut c,
            &format!("QUOTA.EXTEND api:acme s2 300000 AT {}", at(s2 + m * MIN)),
        );
    }
    // QUOTA.PENDING shows its start and last heartbeat.
    let p = items(&ok(
        &mut c,
        &["QUOTA.PENDING", "api:acme", "AT", &at(s2 + 9 * MIN)],
    ));
    assert_eq!(p.len(), 1);
    let row: Vec<i64> = items(&p[0])[1..].iter().map(int).collect();
    assert_eq!(row, vec![60, 9 * MIN, 4 * MIN, s2, s2 + 8 * MIN]);
    // It expires at s2 + 13 min: charged the 8 minutes up to its last heartbeat, at once for
    // every read, before anything is written.
    let later = s2 + 14 * MIN;
    let i = info_at(&mut c, "api:acme", later);
    assert_eq!((i["used"], i["reserved"], i["available"]), (22, 0, 278));
    // A reservation that never had a heartbeat is charged nothing.
    ok_line(
        &mut c,
        &format!("QUOTA.RESERVE api:acme 60 ID s3 TTL 60000 AT {}", at(later)),
    );
    let i = info_at(&mut c, "api:acme", later + 2 * MIN);
    assert_eq!((i["used"], i["reserved"]), (22, 0));
    // The client comes back and settles late with its own measure: it replaces the charge.
    assert_eq!(
        settle(&mut c, "api:acme", "s2", "9", later + 3 * MIN),
        ("late".into(), 9)
    );
    assert_eq!(info_at(&mut c, "api:acme", later + 3 * MIN)["used"], 23);
    // ELAPSED needs a pending reservation: an expired one is settled with an actual.
    let (code, _) = err_line(
        &mut c,
        &format!(
            "QUOTA.SETTLE api:acme s3 ELAPSED AT {}",
            at(later + 3 * MIN)
        ),
    );
    assert_eq!(code, "CONFLICT");

    let counters = info_section(&mut c, "quota");
    assert_eq!(counters["quota_expired_elapsed"], 2, "{counters:?}");
    assert_eq!(counters["quota_expiry_charged"], 8, "{counters:?}");
    let want = [
        "quota.set",
        "quota.reserve",
        "quota.extend",
        "quota.extend",
        "quota.extend",
        "quota.settle",
        "quota.reserve",
        "quota.extend",
        "quota.extend",
        // The RESERVE of s3 first releases s2 (charged): one event per kind in a row.
        "quota.expire-elapsed",
        "quota.reserve",
        // The late SETTLE releases s3 (expired, charged nothing) then settles s2.
        "quota.expire-elapsed",
        "quota.settle",
    ];
    let got: Vec<String> = (0..want.len())
        .map(|_| ps.get_message().unwrap().get_payload::<String>().unwrap())
        .collect();
    assert_eq!(got, want);
}

#[test]
fn unit_and_elapsed_arguments_are_validated() {
    let s = clock_server();
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "plain", "LIMIT", "10", "AT", "1"]);
    ok(
        &mut c,
        &["QUOTA.RESERVE", "plain", "1", "ID", "r", "AT", "1"],
    );
    let (code, msg) = err(
        &mut c,
        &["QUOTA.SETTLE", "plain", "r", "ELAPSED", "AT", "2"],
    );
    assert_eq!(code, "ERR");
    assert!(msg.contains("UNIT"), "{msg}");
    for bad in [
        vec!["QUOTA.SET", "plain", "UNIT", "hour"],
        vec!["QUOTA.SET", "plain", "ONEXPIRE", "NEVER"],
        vec!["QUOTA.SET", "plain", "ONEXPIRE", "ELAPSED"],
        vec!["QUOTA.SET", "new", "LIMIT", "1", "ONEXPIRE", "ELAPSED"],
        vec!["QUOTA.RESERVE", "plain", "1", "KEEP", "-1"],
        vec!["QUOTA.CHARGE", "plain", "1", "KEEP", "x"],
    ] {
        let (code, _) = err(&mut c, &bad);
        assert_eq!(code, "ERR", "{bad:?}");
    }
    // Bad input changed nothing.
    assert_eq!(info_at(&mut c, "plain", 2)["reserved"], 1);
    assert!(matches!(ok(&mut c, &["EXISTS", "new"]), Value::Int(0)));
    // UNIT NONE goes back to plain units, unless ELAPSED needs the unit.
    ok_line(&mut c, "QUOTA.SET plain UNIT s ONEXPIRE ELAPSED AT 3");
    let (code, _) = err(&mut c, &["QUOTA.SET", "plain", "UNIT", "NONE", "AT", "3"]);
    assert_eq!(code, "ERR");
    ok_line(&mut c, "QUOTA.SET plain UNIT NONE ONEXPIRE RELEASE AT 3");
}

/// Tokens: expiries charged in full, a late settle replacing the charge, and KEEP.
#[test]
fn token_budget_charges_expiries_and_keeps_headroom() {
    let s = clock_server();
    let mut c = s.conn();
    #[rustfmt::skip]
    ok(&mut c, &[
        "QUOTA.SET", "tok", "LIMIT", "1000", "ONEXPIRE", "CHARGE", "PERIOD", "DAY",
        "AT", &at(T0),
    ]);
    ok_line(
        &mut c,
        &format!("QUOTA.RESERVE tok 100 ID a TTL 10 AT {}", at(T0)),
    );
    let i = info_at(&mut c, "tok", T0 + 20);
    assert_eq!((i["used"], i["reserved"], i["available"]), (100, 0, 900));
    // Low-priority traffic passes KEEP 200: it may not take the last 200.
    let charge = |c: &mut redis::Connection, n: &str, extra: &[&str], t: i64| -> Vec<i64> {
        let mut cmd = vec!["QUOTA.CHARGE", "tok", n];
        cmd.extend_from_slice(extra);
        let t = at(t);
        cmd.extend_from_slice(&["AT", &t]);
        items(&ok(c, &cmd)).iter().map(int).collect()
    };
    assert_eq!(
        charge(&mut c, "700", &["KEEP", "200"], T0 + 21),
        vec![1, 200, 0]
    );
    // Denied: it would fit in tomorrow's fresh period, so retry_after is the time to midnight.
    let day = 86_400_000;
    assert_eq!(
        charge(&mut c, "1", &["KEEP", "200"], T0 + 22),
        vec![0, 200, day - 22]
    );
    let r = items(&ok_line(
        &mut c,
        &format!("QUOTA.RESERVE tok 1 KEEP 200 AT {}", at(T0 + 22)),
    ));
    assert_eq!((int(&r[0]), int(&r[2]), int(&r[3])), (0, 200, day - 22));
    // A KEEP larger than the limit can never be met: no retry.
    assert_eq!(
        charge(&mut c, "1", &["KEEP", "1000"], T0 + 22),
        vec![0, 200, -1]
    );
    // Priority traffic (no KEEP) uses the headroom.
    assert_eq!(charge(&mut c, "150", &[], T0 + 22), vec![1, 50, 0]);
    // The expired reservation's client settles late: 30 replaces the 100 charged.
    assert_eq!(
        settle(&mut c, "tok", "a", "30", T0 + 23),
        ("late".into(), 30)
    );
    assert_eq!(info_at(&mut c, "tok", T0 + 23)["used"], 880);
    assert_eq!(
        settle(&mut c, "tok", "a", "30", T0 + 24),
        ("duplicate".into(), 30)
    );
    assert_eq!(info_at(&mut c, "tok", T0 + 24)["used"], 880);
    let counters = info_section(&mut c, "quota");
    assert_eq!(
        (
            counters["quota_expired_charge"],
            counters["quota_expiry_charged"]
        ),
        (1, 100)
    );
}

/// The sweeper applies the policy too, and replicas get the charge as an effect.
#[test]
fn sweeper_charges_expiries_and_replicas_follow() {
    let master = Server::start(&[]);
    let replica = Server::start_with_module_args(&[], &["sweep-effort", "0"]);
    let mut m = master.conn();
    let mut r = replica.conn();
    replica.replicate_from(&master);
    ok(
        &mut m,
        &["QUOTA.SET", "k", "LIMIT", "1000", "ONEXPIRE", "CHARGE"],
    );
    ok(
        &mut m,
        &["QUOTA.RESERVE", "k", "100", "ID", "x", "TTL", "30"],
    );
    ok(
        &mut m,
        &["QUOTA.RESERVE", "k", "5", "ID", "y", "TTL", "600000"],
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while info_section(&mut m, "quota")["quota_pending_reservations"] != 1 {
        assert!(Instant::now() < deadline, "the sweeper did not release x");
        std::thread::sleep(Duration::from_millis(20));
    }
    let i = info_section(&mut m, "quota");
    assert_eq!(
        (
            i["quota_sweeper_released"],
            i["quota_expired_charge"],
            i["quota_expiry_charged"]
        ),
        (1, 1, 100)
    );
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(digest(&mut m, "k"), digest(&mut r, "k"));
    assert_eq!(info(&mut r, "k")["used"], 100);
    assert_eq!(
        info_section(&mut r, "quota")["quota_pending_reservations"],
        1
    );
}

/// Changing the policy: reservations expired before the SET keep the old policy's charge.
#[test]
fn the_policy_in_force_at_expiry_applies() {
    let s = clock_server();
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "k", "LIMIT", "100", "AT", "1000"]);
    ok_line(&mut c, "QUOTA.RESERVE k 10 ID a TTL 10 AT 1000");
    ok_line(&mut c, "QUOTA.RESERVE k 20 ID b TTL 100 AT 1000");
    // a expired at 1010 under RELEASE; b expires at 1100 under CHARGE.
    ok(
        &mut c,
        &["QUOTA.SET", "k", "ONEXPIRE", "CHARGE", "AT", "1050"],
    );
    let i = info_at(&mut c, "k", 1200);
    assert_eq!((i["used"], i["reserved"], i["available"]), (20, 0, 80));
}

/// Expiries that charged part of their amount are remembered in a side table: MEMORY USAGE
/// counts it, DEBUG RELOAD and DUMP/RESTORE keep them exactly.
#[test]
fn partial_expiry_charges_are_counted_and_persisted() {
    // The sweeper runs on the wall clock, far past these AT times: it is turned on once the
    // reservations are made, and releases them all; ids are remembered for long.
    let s = Server::start_with_module_args(
        &[],
        &[
            "test-clock",
            "yes",
            "sweep-effort",
            "0",
            "finished-ttl",
            "10000000000000",
        ],
    );
    let mut c = s.conn();
    ok_line(
        &mut c,
        "QUOTA.SET elapsed LIMIT 1000000 ONEXPIRE ELAPSED UNIT ms AT 1000",
    );
    ok_line(&mut c, "QUOTA.SET free LIMIT 1000000 UNIT ms AT 1000");
    // All granted at 1000, then all extended at 1050 (a key's time never goes back).
    for key in ["elapsed", "free"] {
        for i in 0..300 {
            let id = format!("session-{i:04}");
            #[rustfmt::skip]
            ok(&mut c, &["QUOTA.RESERVE", key, "100", "ID", &id, "TTL", "100", "AT", "1000"]);
        }
        for i in 0..300 {
            let id = format!("session-{i:04}");
            ok(&mut c, &["QUOTA.EXTEND", key, &id, "100", "AT", "1050"]);
        }
    }
    ok(&mut c, &["CONFIG", "SET", "quota.sweep-effort", "1000"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while info_section(&mut c, "quota")["quota_pending_reservations"] != 0 {
        assert!(
            Instant::now() < deadline,
            "the sweeper did not release them"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // 50 ms from grant to heartbeat, each.
    assert_eq!(info_at(&mut c, "elapsed", 2000)["used"], 300 * 50);
    assert_eq!(info_at(&mut c, "free", 2000)["used"], 0);
    let usage = |c: &mut redis::Connection, key: &str| -> i64 {
        redis::cmd("MEMORY").arg("USAGE").arg(key).query(c).unwrap()
    };
    let (elapsed, free) = (usage(&mut c, "elapsed"), usage(&mut c, "free"));
    assert!(
        elapsed > free + 300 * 32,
        "MEMORY USAGE elapsed={elapsed} free={free}"
    );
    let before = all_digests(&mut c);
    ok(&mut c, &["DEBUG", "RELOAD"]);
    assert_eq!(all_digests(&mut c), before);
    let dump: Vec<u8> = redis::cmd("DUMP").arg("elapsed").query(&mut c).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("copy")
        .arg(0)
        .arg(&dump)
        .query(&mut c)
        .unwrap();
    assert_eq!(digest(&mut c, "copy"), digest(&mut c, "elapsed"));
    // The charges are remembered: a late settle replaces one.
    assert_eq!(
        settle(&mut c, "copy", "session-0007", "20", 2000),
        ("late".into(), 20)
    );
    assert_eq!(info_at(&mut c, "copy", 2000)["used"], 300 * 50 - 30);
}

/// QUOTA.MRESERVE takes one KEEP for every budget key (window keys ignore it); QUOTA.MSETTLE
/// takes ELAPSED in place of a budget key's actual.
#[test]
fn multi_key_keep_and_elapsed() {
    let s = clock_server();
    let mut c = s.conn();
    ok(
        &mut c,
        &["QUOTA.SET", "b", "LIMIT", "100", "UNIT", "s", "AT", &at(T0)],
    );
    ok(
        &mut c,
        &["QUOTA.SET", "w", "WINDOW", "2", "60000", "AT", &at(T0)],
    );
    let mreserve = |c: &mut redis::Connection, amount: &str, id: &str, keep: Option<&str>| {
        let t = at(T0);
        let mut cmd = vec!["QUOTA.MRESERVE", "2", "b", "w", amount, "1", "ID", id];
        if let Some(k) = keep {
            cmd.extend_from_slice(&["KEEP", k]);
        }
        cmd.extend_from_slice(&["AT", &t]);
        items(&ok(c, &cmd))
    };
    let r = mreserve(&mut c, "70", "r1", Some("20"));
    assert_eq!((int(&r[0]), int(&r[2])), (1, -1));
    // b would keep 10 < 20: denied by b (index 0); the window, at 1 of 2, would admit.
    let r = mreserve(&mut c, "20", "r2", Some("20"));
    assert_eq!((int(&r[0]), int(&r[2]), int(&r[3])), (0, 0, -1));
    // Without KEEP the headroom is there.
    let r = mreserve(&mut c, "20", "r3", None);
    assert_eq!(int(&r[0]), 1);
    // KEEP is checked like any amount.
    let (code, _) = err(&mut c, &["QUOTA.MRESERVE", "1", "b", "1", "KEEP", "-1"]);
    assert_eq!(code, "ERR");

    // ELAPSED for the budget, a count for the window: 2.5 s -> 3.
    let rows = items(&ok_line(
        &mut c,
        &format!("QUOTA.MSETTLE 2 b w r1 ELAPSED 1 AT {}", at(T0 + 2500)),
    ));
    let b_row = items(&rows[0]);
    assert_eq!((text(&b_row[0]), int(&b_row[1])), ("settled".into(), 3));
    // A retry answers the first charge.
    let rows = items(&ok_line(
        &mut c,
        &format!("QUOTA.MSETTLE 2 b w r1 ELAPSED 1 AT {}", at(T0 + 9000)),
    ));
    let b_row = items(&rows[0]);
    assert_eq!((text(&b_row[0]), int(&b_row[1])), ("duplicate".into(), 3));
    // ELAPSED on a window key is an error, and nothing changes anywhere.
    let before = all_digests(&mut c);
    let (code, msg) = err_line(
        &mut c,
        &format!(
            "QUOTA.MSETTLE 2 b w r3 ELAPSED ELAPSED AT {}",
            at(T0 + 3000)
        ),
    );
    assert_eq!(code, "ERR");
    assert!(msg.contains("window"), "{msg}");
    assert_eq!(all_digests(&mut c), before);
    assert_eq!(info_at(&mut c, "b", T0 + 3000)["used"], 3);
}
