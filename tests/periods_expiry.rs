//! Calendar periods with time zones, active expiry by the sweeper, keyspace events, INFO quota
//! and configs. Time is driven with `AT` (quota.test-clock yes); the sweeper runs on wall time.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A server driven by `AT`. Unless `extra` sets `sweep-effort`, its sweeper is off: the
/// sweeper judges expiry by the wall clock, far ahead of these AT times, and would race the
/// commands under test.
fn clock_server(extra: &[&str]) -> Server {
    let mut m = vec!["test-clock", "yes"];
    if !extra.contains(&"sweep-effort") {
        m.extend_from_slice(&["sweep-effort", "0"]);
    }
    m.extend_from_slice(extra);
    Server::start_with_module_args(&[], &m)
}

/// Every QUOTA.INFO field (integers and strings) at `at`.
fn info_all(c: &mut redis::Connection, key: &str, at: i64) -> BTreeMap<String, String> {
    let v = ok(c, &["QUOTA.INFO", key, "AT", &at.to_string()]);
    items(&v)
        .chunks(2)
        .map(|p| {
            let v = match &p[1] {
                Value::Int(n) => n.to_string(),
                other => text(other),
            };
            (text(&p[0]), v)
        })
        .collect()
}

fn quota_info_section(c: &mut redis::Connection) -> BTreeMap<String, i64> {
    info_section(c, "quota")
}

#[test]
fn daily_period_in_new_york_resets_at_local_midnight_across_dst() {
    let s = clock_server(&[]);
    let mut c = s.conn();
    // 2024-03-09 12:00 EST. The next day (DST starts) is 23 hours long.
    let t0 = 1_710_003_600_000i64;
    ok(
        &mut c,
        &[
            "QUOTA.SET",
            "t",
            "LIMIT",
            "100",
            "PERIOD",
            "DAY",
            "TZ",
            "America/New_York",
            "AT",
            &t0.to_string(),
        ],
    );
    let i = info_all(&mut c, "t", t0);
    assert_eq!(i["period"], "DAY");
    assert_eq!(i["tz"], "America/New_York");
    assert_eq!(i["period_start_ms"], "1709960400000");
    assert_eq!(i["period_end_ms"], "1710046800000");
    ok(&mut c, &["QUOTA.CHARGE", "t", "100", "AT", &t0.to_string()]);
    // Denied until local midnight: retry_after is exactly the time left in the period.
    let r = items(&ok(
        &mut c,
        &["QUOTA.RESERVE", "t", "50", "AT", &t0.to_string()],
    ));
    assert_eq!((int(&r[0]), int(&r[3])), (0, 1_710_046_800_000 - t0));
    // An amount that never fits a fresh period: -1.
    let r = items(&ok(
        &mut c,
        &["QUOTA.RESERVE", "t", "101", "AT", &t0.to_string()],
    ));
    assert_eq!(int(&r[3]), -1);
    let r = items(&ok(
        &mut c,
        &["QUOTA.CHARGE", "t", "1", "AT", &t0.to_string()],
    ));
    assert_eq!((int(&r[0]), int(&r[2])), (0, 1_710_046_800_000 - t0));
    // One ms before midnight: still the old day. At midnight: a fresh day (read only, unwritten).
    assert_eq!(info_all(&mut c, "t", 1_710_046_799_999)["used"], "100");
    let i = info_all(&mut c, "t", 1_710_046_800_000);
    assert_eq!((i["used"].as_str(), i["available"].as_str()), ("0", "100"));
    assert_eq!(i["period_start_ms"], "1710046800000");
    assert_eq!(i["period_end_ms"], "1710129600000", "a 23-hour day");
    // The first write of the new day resets for real.
    let r = items(&ok(
        &mut c,
        &["QUOTA.RESERVE", "t", "100", "AT", "1710046800000"],
    ));
    assert_eq!((int(&r[0]), int(&r[2])), (1, 0));
}

#[test]
fn monthly_period_in_a_half_hour_zone_and_anchored_month_end() {
    let s = clock_server(&[]);
    let mut c = s.conn();
    // Asia/Kolkata is UTC+05:30: the month turns at 18:30Z on the last day.
    let t = "1706722200000"; // 2024-01-31 23:00 IST
    ok(
        &mut c,
        &[
            "QUOTA.SET",
            "k",
            "LIMIT",
            "10",
            "PERIOD",
            "MONTH",
            "TZ",
            "Asia/Kolkata",
            "AT",
            t,
        ],
    );
    let i = info_all(&mut c, "k", 1_706_722_200_000);
    assert_eq!(
        (i["period_start_ms"].as_str(), i["period_end_ms"].as_str()),
        ("1704047400000", "1706725800000")
    );
    // A plan bought on Jan 31 09:00 UTC resets on Feb 29 (leap year), then Mar 31, then Apr 30.
    ok(
        &mut c,
        &[
            "QUOTA.SET",
            "a",
            "LIMIT",
            "10",
            "PERIOD",
            "MONTH",
            "ANCHOR",
            "1706691600000",
            "AT",
            "1707955200000",
        ],
    );
    let i = info_all(&mut c, "a", 1_707_955_200_000);
    assert_eq!(
        (i["period_start_ms"].as_str(), i["period_end_ms"].as_str()),
        ("1706691600000", "1709197200000")
    );
    let i = info_all(&mut c, "a", 1_709_197_200_000);
    assert_eq!(
        (i["period_start_ms"].as_str(), i["period_end_ms"].as_str()),
        ("1709197200000", "1711875600000")
    );
    let i = info_all(&mut c, "a", 1_711_875_600_000);
    assert_eq!(i["period_end_ms"], "1714467600000");
    // Weeks start on Monday 00:00 local.
    ok(
        &mut c,
        &[
            "QUOTA.SET",
            "w",
            "LIMIT",
            "10",
            "PERIOD",
            "WEEK",
            "TZ",
            "Europe/Berlin",
            "AT",
            "1709722800000",
        ],
    );
    let i = info_all(&mut c, "w", 1_709_722_800_000);
    assert_eq!(
        (i["period_start_ms"].as_str(), i["period_end_ms"].as_str()),
        ("1709506800000", "1710111600000")
    );
    // A fixed offset zone.
    ok(
        &mut c,
        &[
            "QUOTA.SET",
            "f",
            "LIMIT",
            "10",
            "PERIOD",
            "DAY",
            "TZ",
            "+08:00",
            "AT",
            "1710003600000",
        ],
    );
    assert_eq!(info_all(&mut c, "f", 1_710_003_600_000)["tz"], "+08:00");
}

#[test]
fn period_arguments_are_validated() {
    let s = clock_server(&[]);
    let mut c = s.conn();
    for bad in [
        vec!["QUOTA.SET", "p", "LIMIT", "1", "PERIOD", "FORTNIGHT"],
        vec![
            "QUOTA.SET",
            "p",
            "LIMIT",
            "1",
            "PERIOD",
            "DAY",
            "TZ",
            "Mars/Base",
        ],
        vec![
            "QUOTA.SET",
            "p",
            "LIMIT",
            "1",
            "PERIOD",
            "DAY",
            "TZ",
            "UTC+8",
        ],
        vec!["QUOTA.SET", "p", "LIMIT", "1", "ANCHOR", "5"],
        vec![
            "QUOTA.SET",
            "p",
            "LIMIT",
            "1",
            "PERIOD",
            "DAY",
            "ANCHOR",
            "x",
        ],
        vec![
            "QUOTA.SET",
            "p",
            "LIMIT",
            "1",
            "PERIOD",
            "DAY",
            "ANCHOR",
            &i64::MAX.to_string(),
        ],
    ] {
        assert_eq!(err(&mut c, &bad).0, "ERR", "{bad:?}");
    }
    assert_eq!(keys(&mut c), Vec::<String>::new());
    // PERIOD NONE clears a period; reservations are kept across changes.
    ok(
        &mut c,
        &["QUOTA.SET", "p", "LIMIT", "10", "PERIOD", "HOUR", "AT", "0"],
    );
    ok(
        &mut c,
        &[
            "QUOTA.RESERVE",
            "p",
            "3",
            "ID",
            "r",
            "TTL",
            "999999999",
            "AT",
            "10",
        ],
    );
    ok(&mut c, &["QUOTA.SET", "p", "PERIOD", "NONE", "AT", "20"]);
    let i = info_all(&mut c, "p", 20);
    assert_eq!(
        (
            i["period"].as_str(),
            i["period_start_ms"].as_str(),
            i["reserved"].as_str()
        ),
        ("NONE", "-1", "3")
    );
}

#[test]
fn lazy_reset_is_replicated_and_survives_aof_replay() {
    let mut master = Server::start_with_module_args(
        &["--appendonly", "yes", "--appendfsync", "always"],
        &["test-clock", "yes", "sweep-effort", "0"],
    );
    let replica = Server::start_with_module_args(&[], &["sweep-effort", "0"]);
    let mut m = master.conn();
    let mut r = replica.conn();
    replica.replicate_from(&master);
    let hour = 3_600_000i64;
    ok(
        &mut m,
        &[
            "QUOTA.SET",
            "h",
            "LIMIT",
            "1000",
            "PERIOD",
            "HOUR",
            "TZ",
            "Asia/Kathmandu",
            "AT",
            "1710003600000",
        ],
    );
    for step in 0..30i64 {
        let at = (1_710_003_600_000 + step * hour / 7).to_string();
        ok(&mut m, &["QUOTA.CHARGE", "h", "100", "AT", &at]);
        ok(
            &mut m,
            &[
                "QUOTA.RESERVE",
                "h",
                "10",
                "ID",
                &format!("r{step}"),
                "TTL",
                "600000",
                "AT",
                &at,
            ],
        );
    }
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    let d = digest(&mut m, "h");
    assert_eq!(d, digest(&mut r, "h"));
    master.restart();
    let mut m = master.conn();
    assert_eq!(digest(&mut m, "h"), d);
}

#[test]
fn sweeper_releases_untouched_expired_reservations_and_replicates() {
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    let mut m = master.conn();
    let mut r = replica.conn();
    replica.replicate_from(&master);
    for k in 0..20 {
        let key = format!("s{k}");
        ok(&mut m, &["QUOTA.SET", &key, "LIMIT", "1000"]);
        for i in 0..10 {
            ok(
                &mut m,
                &[
                    "QUOTA.RESERVE",
                    &key,
                    "5",
                    "TTL",
                    &(100 + i * 10).to_string(),
                ],
            );
        }
        ok(
            &mut m,
            &["QUOTA.RESERVE", &key, "1", "ID", "long", "TTL", "600000"],
        );
    }
    // On a busy host some short ones may have expired while the loop above ran (released by
    // a later RESERVE on the key or by the sweeper): each is pending or counted as expired.
    let i = quota_info_section(&mut m);
    assert_eq!(
        i["quota_pending_reservations"] + i["quota_expired"],
        220,
        "{i:?}"
    );
    let expired_before = i["quota_expired"];
    // Nobody touches the keys: the sweeper must release the 200 short ones (within ~1 s on a
    // quiet host; its lag is measured by `make bench`, not asserted here).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let i = quota_info_section(&mut m);
        if i["quota_pending_reservations"] == 20 {
            // From here on nobody touched the keys: the sweeper released the rest.
            assert_eq!(i["quota_expired"], 200, "{i:?}");
            assert!(i["quota_sweeper_released"] >= 200 - expired_before, "{i:?}");
            break;
        }
        assert!(Instant::now() < deadline, "sweeper did not release: {i:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(all_digests(&mut m), all_digests(&mut r));
    // The replica holds the same physical state and never swept on its own.
    let ri = quota_info_section(&mut r);
    assert_eq!(
        (
            ri["quota_pending_reservations"],
            ri["quota_sweeper_released"]
        ),
        (20, 0)
    );
}

/// The same operations on a server whose sweeper runs and one whose sweeper is off give the
/// same answers: reads and decisions never depend on whether a release was written yet.
#[test]
fn swept_and_unswept_expiry_decide_identically() {
    // The sweeper judges expiry by the wall clock, far ahead of these AT times: a long
    // finished-ttl keeps it from also forgetting ids the test clock still remembers.
    let swept = clock_server(&["finished-ttl", "10000000000000", "sweep-effort", "1000"]);
    let unswept = clock_server(&["finished-ttl", "10000000000000", "sweep-effort", "0"]);
    let mut a = swept.conn();
    let mut b = unswept.conn();
    let setup: Vec<Vec<&str>> = vec![
        vec!["QUOTA.SET", "k", "LIMIT", "100", "AT", "1000"],
        vec![
            "QUOTA.RESERVE",
            "k",
            "60",
            "ID",
            "x",
            "TTL",
            "50",
            "AT",
            "1000",
        ],
        // y outlives the wall clock, which the sweeper uses even under the test clock.
        vec![
            "QUOTA.RESERVE",
            "k",
            "30",
            "ID",
            "y",
            "TTL",
            "10000000000000",
            "AT",
            "1000",
        ],
    ];
    // In one transaction: a sweeper tick between the two reservations would release x at the
    // wall clock and move the key's time past the AT of the second (a rare flake before).
    let run = |c: &mut redis::Connection| -> Value {
        let mut p = redis::pipe();
        p.atomic();
        for cmd in &setup {
            p.cmd(cmd[0]).arg(&cmd[1..]);
        }
        p.query(c).unwrap()
    };
    assert_eq!(run(&mut a), run(&mut b));
    // Wall time is far past 1050: the sweeper releases x on `swept` only.
    let deadline = Instant::now() + Duration::from_secs(5);
    while quota_info_section(&mut a)["quota_pending_reservations"] != 1 {
        assert!(Instant::now() < deadline, "sweeper did not run");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(quota_info_section(&mut b)["quota_pending_reservations"], 2);
    let probes: Vec<Vec<&str>> = vec![
        vec!["QUOTA.INFO", "k", "AT", "1100"],
        vec!["QUOTA.PENDING", "k", "AT", "1100"],
        // An expired ROLLBACK on `unswept` writes x's release, which moves the key's time to
        // x's deadline (1050), not to 1200; the sweeper's release did the same on `swept`. The
        // generated id shows the key's time: 1050-0 on both.
        vec!["QUOTA.ROLLBACK", "k", "x", "AT", "1200"],
        vec!["QUOTA.RESERVE", "k", "1", "AT", "1020"],
        vec!["QUOTA.RESERVE", "k", "69", "ID", "z", "AT", "1100"],
        vec!["QUOTA.ROLLBACK", "k", "x", "AT", "1100"],
        vec!["QUOTA.SETTLE", "k", "x", "55", "AT", "1100"],
        vec!["QUOTA.SETTLE", "k", "x", "55", "AT", "1100"],
        vec!["QUOTA.INFO", "k", "AT", "1100"],
    ];
    for cmd in &probes {
        let ra = q(&mut a, cmd).map_err(|e| e.to_string());
        let rb = q(&mut b, cmd).map_err(|e| e.to_string());
        assert_eq!(ra, rb, "{cmd:?}");
    }
    assert_eq!(digest(&mut a, "k"), digest(&mut b, "k"));
}

#[test]
fn keyspace_events_arrive_in_order() {
    let s = clock_server(&[]);
    let mut c = s.conn();
    ok(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "Kd"]);
    let mut sub = s.conn();
    sub.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut ps = sub.as_pubsub();
    ps.subscribe("__keyspace@0__:ev").unwrap();
    let script: Vec<Vec<&str>> = vec![
        vec![
            "QUOTA.SET",
            "ev",
            "LIMIT",
            "10",
            "PERIOD",
            "HOUR",
            "AT",
            "0",
        ],
        vec!["QUOTA.RESERVE", "ev", "4", "ID", "a", "AT", "1"],
        vec![
            "QUOTA.RESERVE",
            "ev",
            "6",
            "ID",
            "b",
            "TTL",
            "10",
            "AT",
            "2",
        ],
        vec!["QUOTA.SETTLE", "ev", "a", "4", "AT", "3"],
        vec!["QUOTA.EXTEND", "ev", "b", "10", "AT", "4"],
        vec!["QUOTA.ROLLBACK", "ev", "b", "AT", "5"],
        vec![
            "QUOTA.RESERVE",
            "ev",
            "1",
            "ID",
            "c",
            "TTL",
            "10",
            "AT",
            "6",
        ],
        vec!["QUOTA.CHARGE", "ev", "1", "AT", "30"],
        vec!["QUOTA.CHARGE", "ev", "1", "AT", "3600000"],
        // A SET that is the first write after a boundary resets first, like any write.
        vec!["QUOTA.SET", "ev", "LIMIT", "12", "AT", "7200000"],
        // A SET that changes nothing publishes nothing.
        vec!["QUOTA.SET", "ev", "LIMIT", "12", "AT", "7200001"],
        vec!["QUOTA.CHARGE", "ev", "1", "AT", "7200002"],
        // Nor just after the next boundary (the reset stays logical until a write changes
        // something): the charge after it resets.
        vec!["QUOTA.SET", "ev", "LIMIT", "12", "AT", "10800000"],
        vec!["QUOTA.CHARGE", "ev", "1", "AT", "10800001"],
    ];
    for cmd in &script {
        ok(&mut c, cmd);
    }
    let want = [
        "quota.set",
        "quota.reserve",
        "quota.reserve",
        "quota.exhausted",
        "quota.settle",
        "quota.extend",
        "quota.rollback",
        "quota.reserve",
        "quota.expire",
        "quota.charge",
        "quota.reset",
        "quota.charge",
        "quota.reset",
        "quota.set",
        "quota.charge",
        "quota.reset",
        "quota.charge",
    ];
    let mut got = Vec::new();
    for _ in 0..want.len() {
        let msg = ps.get_message().unwrap();
        got.push(msg.get_payload::<String>().unwrap());
    }
    assert_eq!(got, want);
}

#[test]
fn info_quota_counters_move() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let before = quota_info_section(&mut c);
    assert_eq!(before["quota_budget_keys"], 0);
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "10"]);
    ok(&mut c, &["QUOTA.RESERVE", "t", "4", "ID", "a"]);
    ok(&mut c, &["QUOTA.RESERVE", "t", "4", "ID", "b"]);
    ok(&mut c, &["QUOTA.RESERVE", "t", "4", "ID", "c"]);
    ok(&mut c, &["QUOTA.SETTLE", "t", "a", "4"]);
    ok(&mut c, &["QUOTA.ROLLBACK", "t", "b"]);
    ok(&mut c, &["QUOTA.CHARGE", "t", "1"]);
    ok(&mut c, &["QUOTA.CHARGE", "t", "100"]);
    let i = quota_info_section(&mut c);
    assert_eq!(i["quota_reserve_granted"], 2);
    assert_eq!(i["quota_reserve_denied"], 1);
    assert_eq!(i["quota_settled"], 1);
    assert_eq!(i["quota_rolled_back"], 1);
    assert_eq!(i["quota_charged"], 1);
    assert_eq!(i["quota_charge_denied"], 1);
    assert_eq!(i["quota_pending_reservations"], 0);
    assert_eq!(i["quota_remembered_ids"], 2);
    assert_eq!(i["quota_budget_keys"], 1);
    ok(&mut c, &["COPY", "t", "t2"]);
    assert_eq!(quota_info_section(&mut c)["quota_remembered_ids"], 4);
    ok(&mut c, &["DEL", "t", "t2"]);
    let i = quota_info_section(&mut c);
    assert_eq!((i["quota_budget_keys"], i["quota_remembered_ids"]), (0, 0));
}

#[test]
fn configs_are_validated_and_applied() {
    let s = Server::start_with_module_args(&[], &["max-pending", "2", "max-id-length", "4"]);
    let mut c = s.conn();
    for (name, bad) in [
        ("quota.max-pending", "0"),
        ("quota.max-id-length", "0"),
        ("quota.max-id-length", "100000"),
        ("quota.sweep-effort", "-1"),
        ("quota.finished-ttl", "-1"),
        ("quota.default-ttl", "0"),
        ("quota.test-clock", "maybe"),
        ("quota.default-ttl", "abc"),
    ] {
        assert_eq!(
            err(&mut c, &["CONFIG", "SET", name, bad]).0,
            "ERR",
            "{name} {bad}"
        );
    }
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "100"]);
    ok(&mut c, &["QUOTA.RESERVE", "t", "1"]);
    ok(&mut c, &["QUOTA.RESERVE", "t", "1"]);
    assert_eq!(err(&mut c, &["QUOTA.RESERVE", "t", "1"]).0, "LIMIT");
    assert_eq!(
        err(&mut c, &["QUOTA.RESERVE", "t", "1", "ID", "abcde"]).0,
        "ERR"
    );
    ok(&mut c, &["CONFIG", "SET", "quota.max-pending", "3"]);
    ok(&mut c, &["QUOTA.RESERVE", "t", "1", "ID", "abcd"]);
    ok(&mut c, &["CONFIG", "SET", "quota.default-ttl", "1234"]);
    ok(&mut c, &["QUOTA.SET", "u", "LIMIT", "1"]);
    assert_eq!(info(&mut c, "u")["default_ttl_ms"], 1234);
    let v: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("quota.max-pending")
        .query(&mut c)
        .unwrap();
    assert_eq!(v, ["quota.max-pending", "3"]);
}

#[test]
fn info_quota_counts_window_keys_and_decisions() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.WINDOW", "w1", "2", "60000"]);
    ok(&mut c, &["QUOTA.WINDOW", "w1", "2", "60000"]);
    ok(&mut c, &["QUOTA.WINDOW", "w1", "2", "60000"]);
    ok(&mut c, &["QUOTA.WINDOW", "w1", "2", "60000", "PEEK"]);
    ok(&mut c, &["QUOTA.WINDOW", "w2", "2", "60000"]);
    ok(&mut c, &["COPY", "w1", "w3"]);
    let i = quota_info_section(&mut c);
    assert_eq!(
        (i["quota_window_allowed"], i["quota_window_denied"]),
        (3, 1)
    );
    assert_eq!(i["quota_window_keys"], 3);
    ok(&mut c, &["DEL", "w1", "w2"]);
    assert_eq!(quota_info_section(&mut c)["quota_window_keys"], 1);
}

/// SWAPDB and FLUSHALL move or drop keys without keyspace events: the sweeper's index follows
/// them through server events, so swapped budgets are still swept.
#[test]
fn sweeper_follows_swapdb_and_flushall() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    ok(&mut c, &["SELECT", "5"]);
    ok(&mut c, &["QUOTA.SET", "sw", "LIMIT", "100"]);
    for _ in 0..5 {
        ok(&mut c, &["QUOTA.RESERVE", "sw", "1", "TTL", "150"]);
    }
    ok(&mut c, &["SWAPDB", "0", "5"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while quota_info_section(&mut c)["quota_pending_reservations"] != 0 {
        assert!(Instant::now() < deadline, "swapped budget never swept");
        std::thread::sleep(Duration::from_millis(25));
    }
    ok(&mut c, &["SELECT", "0"]);
    assert_eq!(info(&mut c, "sw")["pending"], 0);
    ok(&mut c, &["QUOTA.RESERVE", "sw", "1", "TTL", "100000"]);
    assert!(quota_info_section(&mut c)["quota_sweeper_indexed_keys"] >= 1);
    ok(&mut c, &["FLUSHALL"]);
    // Valkey 8 flushes in the background by default (`lazyfree-lazy-user-flush yes`): the
    // budget total follows when the lazy-free thread has freed the value. Poll for it.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let i = quota_info_section(&mut c);
        let counts = (i["quota_sweeper_indexed_keys"], i["quota_budget_keys"]);
        if counts == (0, 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after FLUSHALL: (indexed keys, budget keys) stayed {counts:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A write skips the sweeper's index while the index already has the key's due time (the
/// budget keeps a note of it). A sweep and a rename change the index behind that note, so after
/// either the key must be indexed again: a second short reservation on a swept key, and one on
/// a key renamed (and not touched after), are still swept.
#[test]
fn sweeper_indexes_keys_again_after_a_sweep_and_a_rename() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let swept_down_to = |c: &mut redis::Connection, n: i64, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while quota_info_section(c)["quota_pending_reservations"] != n {
            assert!(Instant::now() < deadline, "{what}: never swept");
            std::thread::sleep(Duration::from_millis(25));
        }
    };
    ok(&mut c, &["QUOTA.SET", "k", "LIMIT", "100"]);
    for round in 0..3 {
        ok(&mut c, &["QUOTA.RESERVE", "k", "1", "TTL", "100"]);
        swept_down_to(&mut c, 0, &format!("round {round}"));
    }
    ok(&mut c, &["QUOTA.SET", "a", "LIMIT", "100"]);
    ok(&mut c, &["QUOTA.RESERVE", "a", "1", "TTL", "3600000"]);
    ok(&mut c, &["QUOTA.RESERVE", "a", "1", "TTL", "200"]);
    ok(&mut c, &["RENAME", "a", "b"]);
    swept_down_to(&mut c, 1, "renamed key");
    assert_eq!(info(&mut c, "b")["pending"], 1);
    assert_eq!(quota_info_section(&mut c)["quota_sweeper_indexed_keys"], 2);
}

/// A key the sweeper is done with (its reservation released, its finished id forgotten) leaves
/// the index, and `quota_sweeper_indexed_keys` says so without waiting for another write.
#[test]
fn sweeper_indexed_keys_gauge_follows_the_sweeper() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    ok(&mut c, &["CONFIG", "SET", "quota.finished-ttl", "200"]);
    ok(&mut c, &["QUOTA.SET", "g", "LIMIT", "10"]);
    ok(&mut c, &["QUOTA.RESERVE", "g", "1", "TTL", "100"]);
    assert_eq!(quota_info_section(&mut c)["quota_sweeper_indexed_keys"], 1);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let i = quota_info_section(&mut c);
        if (i["quota_pending_reservations"], i["quota_remembered_ids"]) == (0, 0) {
            // The last sweep of the key leaves nothing to index.
            assert_eq!(i["quota_sweeper_indexed_keys"], 0);
            break;
        }
        assert!(Instant::now() < deadline, "never swept: {i:?}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// At the latest `AT` (9999-11-01T00:00Z) every period, a month in the furthest zones
/// included, is still computed: `used` resets into the period containing it, and `QUOTA.SET`
/// keeps working there (a later `AT` is refused before anything runs).
#[test]
fn periods_still_reset_at_the_latest_at() {
    let s = clock_server(&[]);
    let mut c = s.conn();
    let last = 253_397_030_400_000_i64;
    for (key, period, tz) in [
        ("d", "DAY", "Europe/Paris"),
        ("m", "MONTH", "Pacific/Kiritimati"),
        ("w", "MONTH", "-12:00"),
    ] {
        ok(
            &mut c,
            &[
                "QUOTA.SET",
                key,
                "LIMIT",
                "1000",
                "PERIOD",
                period,
                "TZ",
                tz,
            ],
        );
        ok(&mut c, &["QUOTA.CHARGE", key, "600"]);
        let i = info_all(&mut c, key, last);
        assert_eq!(i["used"], "0", "{key}: {i:?}");
        let (start, end): (i64, i64) = (
            i["period_start_ms"].parse().unwrap(),
            i["period_end_ms"].parse().unwrap(),
        );
        assert!(start <= last && last < end, "{key}: {i:?}");
        let r = items(&ok(
            &mut c,
            &["QUOTA.RESERVE", key, "1000", "AT", &last.to_string()],
        ));
        assert_eq!(int(&r[0]), 1, "{key}");
        ok(&mut c, &["QUOTA.SET", key, "LIMIT", "2000"]);
        assert_eq!(info_all(&mut c, key, last)["limit"], "2000");
    }
    let (_, msg) = err(
        &mut c,
        &["QUOTA.CHARGE", "d", "1", "AT", &(last + 1).to_string()],
    );
    assert!(msg.contains("AT must be at most 253397030400000"), "{msg}");
}
