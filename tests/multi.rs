//! Multi-limit admission (issue 19): QUOTA.SET WINDOW, the config form of QUOTA.WINDOW,
//! QUOTA.MRESERVE / MSETTLE / MROLLBACK / MEXTEND over budgets and configured windows — every
//! reply shape, all or nothing (a denial or an error changes no key: digests unchanged), bad
//! input, COMMAND GETKEYS, and a replica and AOF replays digest-equal after a random workload.
//!
//! Time is driven with `AT` (quota.test-clock yes) from `T0`, far in the future of the wall
//! clock, so nothing expires on its own while a test runs.

mod common;
use common::*;
use std::time::Duration;

const T0: i64 = 4_102_444_800_000; // 2100-01-01

fn server() -> Server {
    Server::start_with_module_args(&[], &["test-clock", "yes"])
}

fn at(t: i64) -> String {
    (T0 + t).to_string()
}

/// Runs `args` with a trailing `AT T0+t`.
fn qa(c: &mut redis::Connection, t: i64, args: &[&str]) -> redis::RedisResult<Value> {
    let when = at(t);
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["AT", &when]);
    q(c, &all)
}

fn oka(c: &mut redis::Connection, t: i64, args: &[&str]) -> Value {
    qa(c, t, args).unwrap_or_else(|e| panic!("{args:?} failed: {e}"))
}

fn erra(c: &mut redis::Connection, t: i64, args: &[&str]) -> (String, String) {
    match qa(c, t, args) {
        Ok(v) => panic!("{args:?} should fail, got {v:?}"),
        Err(e) => (e.code().unwrap_or("").to_string(), e.to_string()),
    }
}

fn ints(v: &Value) -> Vec<i64> {
    items(v).iter().map(int).collect()
}

/// The five limits of one gateway request: key/team/org budgets, RPM, TPM, concurrency.
fn setup(c: &mut redis::Connection) {
    oka(c, 0, &["QUOTA.SET", "q:{t1}:key", "LIMIT", "10000"]);
    oka(c, 0, &["QUOTA.SET", "q:{t1}:team", "LIMIT", "50000"]);
    oka(c, 0, &["QUOTA.SET", "q:{t1}:org", "LIMIT", "100000"]);
    oka(c, 0, &["QUOTA.SET", "q:{t1}:rpm", "WINDOW", "3", "60000"]);
    oka(
        c,
        0,
        &[
            "QUOTA.SET",
            "q:{t1}:tpm",
            "WINDOW",
            "5000",
            "60000",
            "PRECISION",
            "1000",
        ],
    );
    oka(c, 0, &["QUOTA.SET", "q:{t1}:conc", "LIMIT", "2"]);
}

const KEYS: [&str; 6] = [
    "q:{t1}:key",
    "q:{t1}:team",
    "q:{t1}:org",
    "q:{t1}:rpm",
    "q:{t1}:tpm",
    "q:{t1}:conc",
];

fn mreserve(c: &mut redis::Connection, t: i64, amounts: [i64; 6], id: Option<&str>) -> Value {
    let a: Vec<String> = amounts.iter().map(ToString::to_string).collect();
    let mut args = vec!["QUOTA.MRESERVE", "6"];
    args.extend(KEYS);
    args.extend(a.iter().map(String::as_str));
    if let Some(id) = id {
        args.extend(["ID", id]);
    }
    oka(c, t, &args)
}

fn digests(c: &mut redis::Connection) -> Vec<(String, String)> {
    all_digests(c)
}

#[test]
fn mreserve_grants_retries_and_denies_all_or_nothing() {
    let s = server();
    let mut c = s.conn();
    setup(&mut c);
    // A grant: the same generated id on every key, each key's value after the call.
    let r = items(&mreserve(&mut c, 10, [4000, 4000, 4000, 1, 4000, 1], None));
    assert_eq!(int(&r[0]), 1);
    let id = text(&r[1]);
    assert_eq!(id, format!("{}-0", T0 + 10));
    assert_eq!(int(&r[2]), -1);
    assert_eq!(int(&r[3]), 0);
    assert_eq!(ints(&r[4]), vec![6000, 46000, 96000, 2, 1000, 1]);
    assert_eq!(info_at(&mut c, "q:{t1}:key", T0 + 10)["reserved"], 4000);
    let w = info_at(&mut c, "q:{t1}:tpm", T0 + 10);
    assert_eq!(
        (
            w["limit"],
            w["counted"],
            w["remaining"],
            w["remembered_ids"]
        ),
        (5000, 4000, 1000, 1)
    );
    // A client id; a retry (same keys and amounts, in any order) takes nothing more.
    let r = items(&mreserve(
        &mut c,
        20,
        [100, 100, 100, 1, 100, 1],
        Some("req-1"),
    ));
    assert_eq!((int(&r[0]), text(&r[1])), (1, "req-1".to_string()));
    assert_eq!(ints(&r[4]), vec![5900, 45900, 95900, 1, 900, 0]);
    let before = digests(&mut c);
    let r = items(&mreserve(
        &mut c,
        30,
        [100, 100, 100, 1, 100, 1],
        Some("req-1"),
    ));
    assert_eq!(
        (int(&r[0]), text(&r[1]), int(&r[2])),
        (1, "req-1".to_string(), -1)
    );
    assert_eq!(ints(&r[4]), vec![5900, 45900, 95900, 1, 900, 0]);
    let reordered = oka(
        &mut c,
        30,
        &[
            "QUOTA.MRESERVE",
            "6",
            "q:{t1}:conc",
            "q:{t1}:tpm",
            "q:{t1}:rpm",
            "q:{t1}:org",
            "q:{t1}:team",
            "q:{t1}:key",
            "1",
            "100",
            "1",
            "100",
            "100",
            "100",
            "ID",
            "req-1",
        ],
    );
    assert_eq!(
        ints(&items(&reordered)[4]),
        vec![0, 900, 1, 95900, 45900, 5900]
    );
    assert_eq!(before, digests(&mut c));
    // Other amounts, or other keys, under the same id: CONFLICT, nothing changes.
    let (code, _) = erra(
        &mut c,
        30,
        &[
            "QUOTA.MRESERVE",
            "2",
            "q:{t1}:key",
            "q:{t1}:tpm",
            "100",
            "101",
            "ID",
            "req-1",
        ],
    );
    assert_eq!(code, "CONFLICT");
    oka(&mut c, 0, &["QUOTA.SET", "q:{t1}:other", "LIMIT", "10"]);
    let before = digests(&mut c);
    let (code, msg) = erra(
        &mut c,
        30,
        &[
            "QUOTA.MRESERVE",
            "2",
            "q:{t1}:key",
            "q:{t1}:other",
            "100",
            "1",
            "ID",
            "req-1",
        ],
    );
    assert_eq!(code, "CONFLICT", "{msg}");
    assert_eq!(before, digests(&mut c));
    // The concurrency limit (2 in flight) denies the third request: nothing is taken anywhere,
    // not even the RPM and TPM counts of the keys before it.
    let r = items(&mreserve(&mut c, 40, [1, 1, 1, 1, 1, 1], None));
    assert_eq!(int(&r[0]), 0);
    assert_eq!(r[1], Value::Nil);
    assert_eq!(int(&r[2]), 5);
    assert_eq!(int(&r[3]), -1, "a budget without a period: -1");
    assert_eq!(ints(&r[4]), vec![5900, 45900, 95900, 1, 900, 0]);
    assert_eq!(before, digests(&mut c));
    // A window that denies gives its exact retry time (the RPM's first count leaves at 60 s).
    oka(&mut c, 50, &["QUOTA.ROLLBACK", "q:{t1}:conc", "req-1"]);
    let r = items(&mreserve(&mut c, 50, [1, 1, 1, 1, 1, 1], None));
    assert_eq!(int(&r[0]), 1);
    let r = items(&mreserve(&mut c, 60, [1, 1, 1, 1, 1, 0], None));
    assert_eq!((int(&r[0]), int(&r[2])), (0, 3));
    // The RPM's bucket [T0, T0 + 999] leaves the 60 s window at T0 + 60 999.
    assert_eq!(int(&r[3]), 60_939, "{r:?}");
    // INFO counters.
    let i = info_section(&mut c, "quota");
    assert_eq!(i["quota_mreserve_granted"], 5);
    assert_eq!(i["quota_mreserve_denied"], 2);
}

#[test]
fn msettle_corrects_windows_and_settles_budgets() {
    let s = server();
    let mut c = s.conn();
    setup(&mut c);
    mreserve(&mut c, 0, [3000, 3000, 3000, 1, 3000, 1], Some("a"));
    let settle = |c: &mut redis::Connection, t: i64, actual: &str| {
        oka(
            c,
            t,
            &[
                "QUOTA.MSETTLE",
                "6",
                KEYS[0],
                KEYS[1],
                KEYS[2],
                KEYS[3],
                KEYS[4],
                KEYS[5],
                "a",
                actual,
                actual,
                actual,
                "1",
                actual,
                "0",
            ],
        )
    };
    let r = items(&settle(&mut c, 100, "1200"));
    let row = |i: usize| {
        let v = items(&r[i]);
        (text(&v[0]), int(&v[1]), int(&v[2]))
    };
    assert_eq!(row(0), ("settled".into(), 1200, 8800));
    assert_eq!(row(3), ("corrected".into(), 1, 2));
    // The TPM over-estimate is given back at once.
    assert_eq!(row(4), ("corrected".into(), 1200, 3800));
    assert_eq!(row(5), ("settled".into(), 0, 2));
    assert_eq!(info_at(&mut c, "q:{t1}:tpm", T0 + 100)["counted"], 1200);
    // A duplicate settle charges nothing more anywhere.
    let before = digests(&mut c);
    let r = items(&settle(&mut c, 200, "1200"));
    for v in &r {
        assert_eq!(text(&items(v)[0]), "duplicate");
    }
    assert_eq!(before, digests(&mut c));
    // Another actual: CONFLICT, nothing changes.
    let (code, _) = match qa(
        &mut c,
        200,
        &["QUOTA.MSETTLE", "2", KEYS[0], KEYS[4], "a", "5", "5"],
    ) {
        Err(e) => (e.code().unwrap_or("").to_string(), e.to_string()),
        Ok(v) => panic!("{v:?}"),
    };
    assert_eq!(code, "CONFLICT");
    assert_eq!(before, digests(&mut c));
    // An id a listed budget does not know: NORESERVATION, nothing changes anywhere.
    mreserve(&mut c, 300, [10, 10, 10, 1, 10, 1], Some("b"));
    let before = digests(&mut c);
    let (code, _) = erra(
        &mut c,
        400,
        &[
            "QUOTA.MSETTLE",
            "3",
            KEYS[4],
            KEYS[0],
            KEYS[1],
            "nope",
            "1",
            "1",
            "1",
        ],
    );
    assert_eq!(code, "NORESERVATION");
    assert_eq!(before, digests(&mut c));
    // After the bucket left the window a window key skips the correction (not an error) and
    // a budget whose reservation expired settles late.
    oka(
        &mut c,
        400,
        &["QUOTA.MEXTEND", "2", KEYS[0], KEYS[4], "b", "10"],
    );
    let r = items(&oka(
        &mut c,
        70_000,
        &["QUOTA.MSETTLE", "2", KEYS[0], KEYS[4], "b", "50", "50"],
    ));
    assert_eq!(text(&items(&r[0])[0]), "late");
    assert_eq!(
        (
            text(&items(&r[1])[0]),
            int(&items(&r[1])[1]),
            int(&items(&r[1])[2])
        ),
        ("skipped".into(), 50, 5000)
    );
    let i = info_section(&mut c, "quota");
    assert_eq!((i["quota_msettled"], i["quota_msettled_late"]), (6, 1));
}

/// `[status, amount, value]` of each key of an MSETTLE / MROLLBACK reply.
fn key_rows(v: &Value) -> Vec<(String, i64, i64)> {
    items(v)
        .iter()
        .map(|r| {
            let r = items(r);
            (text(&r[0]), int(&r[1]), int(&r[2]))
        })
        .collect()
}

/// Issue 19, found by a user: a late MSETTLE after an MROLLBACK that released nothing on an
/// expired budget but gave the window's count back. The window key is `skipped` (its count
/// was given back), so the budget's late charge is not lost; a budget whose reservation was
/// really rolled back still refuses (CONFLICT) and nothing changes.
#[test]
fn msettle_after_a_window_rollback_still_charges_the_budget_late() {
    let s = server();
    let mut c = s.conn();
    oka(
        &mut c,
        0,
        &["QUOTA.SET", "{q}:b1", "LIMIT", "100", "TTL", "1000"],
    );
    oka(&mut c, 0, &["QUOTA.SET", "{q}:w", "WINDOW", "10", "60000"]);
    let keys = ["{q}:b1", "{q}:w"];
    let mut reserve = vec!["QUOTA.MRESERVE", "2"];
    reserve.extend(keys);
    reserve.extend(["5", "1", "ID", "e1", "TTL", "1000"]);
    assert_eq!(int(&items(&oka(&mut c, 0, &reserve))[0]), 1);
    let mut rollback = vec!["QUOTA.MROLLBACK", "2"];
    rollback.extend(keys);
    rollback.push("e1");
    assert_eq!(
        key_rows(&oka(&mut c, 2000, &rollback)),
        [("expired".into(), 0, 100), ("rolledback".into(), 1, 10)]
    );
    let mut settle = vec!["QUOTA.MSETTLE", "2"];
    settle.extend(keys);
    settle.extend(["e1", "3", "1"]);
    assert_eq!(
        key_rows(&oka(&mut c, 2100, &settle)),
        [("late".into(), 3, 97), ("skipped".into(), 1, 10)]
    );
    assert_eq!(info_at(&mut c, "{q}:b1", T0 + 2100)["used"], 3);
    assert_eq!(info_at(&mut c, "{q}:w", T0 + 2100)["counted"], 0);
    // Retried: the budget's duplicate, the window skipped again; nothing changes.
    let before = digests(&mut c);
    assert_eq!(
        key_rows(&oka(&mut c, 2200, &settle)),
        [("duplicate".into(), 3, 97), ("skipped".into(), 1, 10)]
    );
    assert_eq!(before, digests(&mut c));
    // Rolled back in time on the budget: the budget decides, CONFLICT, nothing changes.
    let mut reserve2 = vec!["QUOTA.MRESERVE", "2"];
    reserve2.extend(keys);
    reserve2.extend(["5", "1", "ID", "e2"]);
    oka(&mut c, 3000, &reserve2);
    let mut rollback2 = vec!["QUOTA.MROLLBACK", "2"];
    rollback2.extend(keys);
    rollback2.push("e2");
    assert_eq!(
        key_rows(&oka(&mut c, 3100, &rollback2)),
        [("rolledback".into(), 5, 97), ("rolledback".into(), 1, 10)]
    );
    let before = digests(&mut c);
    let mut settle2 = vec!["QUOTA.MSETTLE", "2"];
    settle2.extend(keys);
    settle2.extend(["e2", "3", "1"]);
    let (code, msg) = erra(&mut c, 3200, &settle2);
    assert_eq!(code, "CONFLICT", "{msg}");
    assert!(msg.contains("(key '{q}:b1')"), "{msg}");
    assert_eq!(before, digests(&mut c));
}

/// Issue 19: a retry (same ID, keys, amounts) after the window key has forgotten the id (its
/// bucket left the window) is a CONFLICT that says so, and changes nothing.
#[test]
fn a_retry_after_the_window_forgot_the_id_says_why() {
    let s = server();
    let mut c = s.conn();
    oka(
        &mut c,
        0,
        &["QUOTA.SET", "{z}:b", "LIMIT", "100000", "TTL", "600000"],
    );
    oka(
        &mut c,
        0,
        &["QUOTA.SET", "{z}:w", "WINDOW", "1000", "60000"],
    );
    let call = [
        "QUOTA.MRESERVE",
        "2",
        "{z}:b",
        "{z}:w",
        "500",
        "500",
        "ID",
        "late1",
    ];
    oka(&mut c, 0, &call);
    // Inside the window: the same request again, nothing more taken.
    let r = items(&oka(&mut c, 30_000, &call));
    assert_eq!((int(&r[0]), text(&r[1])), (1, "late1".to_string()));
    assert_eq!(ints(&r[4]), [99_500, 500]);
    let before = digests(&mut c);
    let (code, msg) = erra(&mut c, 120_000, &call);
    assert_eq!(code, "CONFLICT");
    assert!(
        msg.contains(
            "is pending on other listed keys: a retry must name the same keys and amounts, \
             and this window key does not remember it (its bucket left the window, or it was \
             not listed): a retry after the window is a new request (a new ID) (key '{z}:w')"
        ),
        "{msg}"
    );
    assert_eq!(before, digests(&mut c));
}

#[test]
fn mrollback_gives_back_what_each_key_counted() {
    let s = server();
    let mut c = s.conn();
    setup(&mut c);
    mreserve(&mut c, 0, [500, 500, 500, 1, 500, 1], Some("r"));
    let before = info_at(&mut c, "q:{t1}:tpm", T0);
    assert_eq!(before["counted"], 500);
    let mut args = vec!["QUOTA.MROLLBACK", "6"];
    args.extend(KEYS);
    args.push("r");
    let r = items(&oka(&mut c, 10, &args));
    let rows: Vec<(String, i64, i64)> = r
        .iter()
        .map(|v| {
            let v = items(v);
            (text(&v[0]), int(&v[1]), int(&v[2]))
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            ("rolledback".into(), 500, 10000),
            ("rolledback".into(), 500, 50000),
            ("rolledback".into(), 500, 100000),
            ("rolledback".into(), 1, 3),
            ("rolledback".into(), 500, 5000),
            ("rolledback".into(), 1, 2),
        ]
    );
    let digests_after = digests(&mut c);
    let r = items(&oka(&mut c, 20, &args));
    assert!(r.iter().all(|v| text(&items(v)[0]) == "duplicate"));
    assert_eq!(digests_after, digests(&mut c));
    // A settle after a rollback is a CONFLICT on the budgets; a window key skips it (its
    // count was given back; issue 19): nothing changes.
    let (code, _) = erra(&mut c, 20, &["QUOTA.MSETTLE", "1", KEYS[0], "r", "1"]);
    assert_eq!(code, "CONFLICT");
    let before = digests(&mut c);
    let r = key_rows(&oka(&mut c, 20, &["QUOTA.MSETTLE", "1", KEYS[4], "r", "1"]));
    assert_eq!(r[0].0, "skipped");
    assert_eq!(before, digests(&mut c));
    // Once the bucket has left the window a window key has nothing to give back: skipped;
    // an expired budget reservation: expired.
    mreserve(&mut c, 100, [7, 7, 7, 1, 7, 1], Some("s"));
    oka(&mut c, 100, &["QUOTA.EXTEND", KEYS[0], "s", "5"]);
    let r = items(&oka(
        &mut c,
        61_000,
        &["QUOTA.MROLLBACK", "2", KEYS[0], KEYS[4], "s"],
    ));
    assert_eq!(text(&items(&r[0])[0]), "expired");
    assert_eq!(
        (text(&items(&r[1])[0]), int(&items(&r[1])[1])),
        ("skipped".into(), 0)
    );
    // Single-key commands on one key of a multi-key reservation act on that key alone.
    mreserve(&mut c, 62_000, [9, 9, 9, 1, 9, 1], Some("t"));
    let r = items(&oka(&mut c, 62_001, &["QUOTA.SETTLE", KEYS[1], "t", "4"]));
    assert_eq!(text(&r[0]), "settled");
    assert_eq!(info_at(&mut c, KEYS[0], T0 + 62_001)["reserved"], 9);
    let r = items(&oka(
        &mut c,
        62_001,
        &["QUOTA.MEXTEND", "3", KEYS[0], KEYS[4], KEYS[5], "t", "1000"],
    ));
    assert_eq!(r, vec![Value::Int(1000), Value::Nil, Value::Int(1000)]);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let s = server();
    let mut c = s.conn();
    setup(&mut c);
    mreserve(&mut c, 0, [1, 1, 1, 1, 1, 1], Some("x"));
    oka(&mut c, 0, &["QUOTA.WINDOW", "plain", "10", "1000"]);
    ok(&mut c, &["SET", "str", "v"]);
    let before = digests(&mut c);
    let k17: Vec<String> = (0..17).map(|i| format!("k{i}")).collect();
    let mut too_many = vec!["QUOTA.MRESERVE", "17"];
    too_many.extend(k17.iter().map(String::as_str));
    too_many.extend(std::iter::repeat_n("1", 17));
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["QUOTA.MRESERVE", "0", KEYS[0], "1"], "ERR"),
        (too_many, "ERR"),
        (vec!["QUOTA.MRESERVE", "-1", KEYS[0], "1"], "ERR"),
        (vec!["QUOTA.MRESERVE", "x", KEYS[0], "1"], "ERR"),
        (vec!["QUOTA.MRESERVE", "2", KEYS[0], KEYS[1], "1"], "ERR"),
        (
            vec!["QUOTA.MRESERVE", "2", KEYS[0], KEYS[1], "1", "-1"],
            "ERR",
        ),
        (
            vec!["QUOTA.MRESERVE", "2", KEYS[0], KEYS[0], "1", "1"],
            "ERR",
        ),
        (
            vec!["QUOTA.MRESERVE", "2", KEYS[0], "str", "1", "1"],
            "WRONGTYPE",
        ),
        (
            vec!["QUOTA.MRESERVE", "2", KEYS[0], "plain", "1", "1"],
            "NOQUOTA",
        ),
        (
            vec!["QUOTA.MRESERVE", "2", KEYS[0], "missing", "1", "1"],
            "NOQUOTA",
        ),
        (vec!["QUOTA.MRESERVE", "1", KEYS[0], "1", "TTL", "0"], "ERR"),
        (vec!["QUOTA.MRESERVE", "1", KEYS[0], "1", "BOGUS"], "ERR"),
        (vec!["QUOTA.MRESERVE", "1", KEYS[0], "1", "ID", ""], "ERR"),
        (
            vec!["QUOTA.MSETTLE", "2", KEYS[0], KEYS[4], "x", "1"],
            "ERR",
        ),
        (
            vec!["QUOTA.MSETTLE", "2", KEYS[0], KEYS[4], "x", "1", "-1"],
            "ERR",
        ),
        (
            vec!["QUOTA.MSETTLE", "2", KEYS[0], "missing", "x", "1", "1"],
            "NOQUOTA",
        ),
        (
            vec![
                "QUOTA.MSETTLE",
                "2",
                KEYS[4],
                KEYS[0],
                "x",
                "1",
                "9223372036854775808",
            ],
            "ERR",
        ),
        (vec!["QUOTA.MROLLBACK", "2", KEYS[0], KEYS[0], "x"], "ERR"),
        (
            vec!["QUOTA.MROLLBACK", "2", KEYS[0], "str", "x"],
            "WRONGTYPE",
        ),
        (vec!["QUOTA.MEXTEND", "1", KEYS[0], "x", "0"], "ERR"),
        (
            vec!["QUOTA.MEXTEND", "1", KEYS[0], "nope", "10"],
            "NORESERVATION",
        ),
        (
            vec!["QUOTA.SET", KEYS[0], "WINDOW", "5", "1000"],
            "WRONGTYPE",
        ),
        (vec!["QUOTA.SET", KEYS[4], "LIMIT", "5"], "WRONGTYPE"),
        (vec!["QUOTA.SET", "w", "WINDOW", "-1", "1000"], "ERR"),
        (
            vec!["QUOTA.SET", "w", "WINDOW", "1", "1000", "PRECISION", "2000"],
            "ERR",
        ),
        (
            vec!["QUOTA.SET", "w", "WINDOW", "1", "1000", "NX", "XX"],
            "ERR",
        ),
        (vec!["QUOTA.WINDOW", "plain", "COST", "1"], "NOQUOTA"),
        (vec!["QUOTA.WINDOW", "missing"], "NOQUOTA"),
        (vec!["QUOTA.WINDOW", KEYS[4], "PRECISION", "5"], "ERR"),
        (vec!["QUOTA.WINDOW", KEYS[0], "COST", "1"], "WRONGTYPE"),
    ];
    for (args, code) in cases {
        let (got, msg) = erra(&mut c, 5, &args);
        assert_eq!(got, code, "{args:?}: {msg}");
        assert_eq!(before, digests(&mut c), "{args:?} changed something");
    }
    // A window key given no budget option (only NX, XX or AT) has nothing to change: 0, as a
    // budget given none; given one, WRONGTYPE (above).
    for extra in [&[][..], &["NX"], &["XX"]] {
        let mut args = vec!["QUOTA.SET", KEYS[4]];
        args.extend_from_slice(extra);
        assert_eq!(oka(&mut c, 5, &args), Value::Int(0), "{args:?}");
        assert_eq!(before, digests(&mut c), "{args:?} changed something");
    }
    assert!(!keys(&mut c).contains(&"w".to_string()));
}

#[test]
fn set_window_stores_a_configuration_that_never_expires() {
    let s = server();
    let mut c = s.conn();
    // A plain window key has an expiry; configuring it removes it and keeps its counts.
    oka(
        &mut c,
        0,
        &["QUOTA.WINDOW", "w", "10", "60000", "COST", "4"],
    );
    assert!(int(&ok(&mut c, &["PTTL", "w"])) > 0);
    assert_eq!(
        int(&oka(
            &mut c,
            0,
            &["QUOTA.SET", "w", "WINDOW", "10", "60000", "XX"]
        )),
        0
    );
    assert_eq!(int(&ok(&mut c, &["PTTL", "w"])), -1);
    let i = info_at(&mut c, "w", T0);
    assert_eq!(
        (
            i["limit"],
            i["window_ms"],
            i["precision_ms"],
            i["counted"],
            i["remaining"]
        ),
        (10, 60000, 1000, 4, 6)
    );
    // The config form counts under the stored configuration; explicit arguments still work
    // for that call only.
    assert_eq!(
        ints(&oka(&mut c, 1, &["QUOTA.WINDOW", "w", "COST", "5"]))[..2],
        [1, 1]
    );
    assert_eq!(
        ints(&oka(&mut c, 2, &["QUOTA.WINDOW", "w", "PEEK"]))[..2],
        [1, 1]
    );
    assert_eq!(
        ints(&oka(&mut c, 2, &["QUOTA.WINDOW", "w", "COST", "2"]))[..2],
        [0, 1]
    );
    assert_eq!(
        ints(&oka(&mut c, 3, &["QUOTA.WINDOW", "w", "100", "60000"]))[..2],
        [1, 90]
    );
    assert_eq!(info_at(&mut c, "w", T0 + 3)["limit"], 10);
    assert_eq!(int(&ok(&mut c, &["PTTL", "w"])), -1);
    // NX on an existing key, the same configuration again: 0, nothing written.
    let d = digest(&mut c, "w");
    assert_eq!(
        int(&oka(
            &mut c,
            4,
            &["QUOTA.SET", "w", "WINDOW", "1", "1000", "NX"]
        )),
        0
    );
    assert_eq!(
        int(&oka(
            &mut c,
            4,
            &["QUOTA.SET", "w", "WINDOW", "10", "60000"]
        )),
        0
    );
    assert_eq!(d, digest(&mut c, "w"));
    // XX on a missing key: nothing; a new key: 1, empty, no expiry, and it stays (not deleted
    // when empty).
    assert_eq!(
        int(&oka(
            &mut c,
            4,
            &["QUOTA.SET", "n", "WINDOW", "1", "1000", "XX"]
        )),
        0
    );
    assert!(!keys(&mut c).contains(&"n".to_string()));
    assert_eq!(
        int(&oka(&mut c, 4, &["QUOTA.SET", "n", "WINDOW", "1", "1000"])),
        1
    );
    assert_eq!(int(&ok(&mut c, &["PTTL", "n"])), -1);
    let i = info_at(&mut c, "n", T0 + 1_000_000);
    assert_eq!(
        (i["counted"], i["remaining"], i["reset_after_ms"]),
        (0, 1, 0)
    );
    // A new precision keeps the counts (moved later, as a call with it would).
    oka(
        &mut c,
        5,
        &[
            "QUOTA.SET",
            "w",
            "WINDOW",
            "20",
            "60000",
            "PRECISION",
            "100",
        ],
    );
    let i = info_at(&mut c, "w", T0 + 5);
    assert_eq!((i["limit"], i["precision_ms"], i["counted"]), (20, 100, 10));
    // An unconfigured window key in QUOTA.INFO: its last call's window, limit -1.
    oka(&mut c, 0, &["QUOTA.WINDOW", "p", "10", "1000"]);
    let i = info_at(&mut c, "p", T0);
    assert_eq!(
        (i["limit"], i["window_ms"], i["counted"], i["remaining"]),
        (-1, 1000, 1, -1)
    );
}

#[test]
fn command_getkeys_finds_every_key() {
    let s = server();
    let mut c = s.conn();
    let cases: [&[&str]; 5] = [
        &[
            "QUOTA.MRESERVE",
            "3",
            "a",
            "b",
            "c",
            "1",
            "2",
            "3",
            "ID",
            "x",
            "TTL",
            "5",
        ],
        &["QUOTA.MSETTLE", "2", "a", "b", "x", "1", "2"],
        &["QUOTA.MROLLBACK", "3", "a", "b", "c", "x"],
        &["QUOTA.MEXTEND", "1", "a", "x", "1000"],
        &["QUOTA.MAPPLY", "2", "a", "b", "B 1:x W 1:y"],
    ];
    for args in cases {
        let mut all = vec!["COMMAND", "GETKEYS"];
        all.extend(args);
        let got: Vec<String> = items(&ok(&mut c, &all)).iter().map(text).collect();
        let n: usize = args[1].parse().unwrap();
        let want: Vec<String> = args[2..2 + n].iter().map(|s| s.to_string()).collect();
        assert_eq!(got, want, "{args:?}");
    }
    // The key spec: movable keys, found by keynum from argv[1].
    let info = format!("{:?}", ok(&mut c, &["COMMAND", "INFO", "QUOTA.MRESERVE"]));
    assert!(info.contains("movablekeys"), "{info}");
    assert!(info.contains("keynum"), "{info}");
}

#[test]
fn denials_and_errors_touch_no_watched_key() {
    let s = server();
    let mut c = s.conn();
    setup(&mut c);
    for k in KEYS {
        assert!(untouched(&mut c, k, |c| {
            let r = items(&mreserve(c, 0, [1, 1, 1, 1, 1, 5], None));
            assert_eq!(int(&r[0]), 0);
        }));
        assert!(untouched(&mut c, k, |c| {
            erra(
                c,
                0,
                &["QUOTA.MSETTLE", "2", KEYS[0], KEYS[4], "nope", "1", "1"],
            );
        }));
    }
    assert!(!untouched(&mut c, KEYS[4], |c| {
        mreserve(c, 0, [1, 1, 1, 1, 1, 1], None);
    }));
}

#[test]
fn configured_window_memory_stays_within_1_kib() {
    let s = server();
    let mut c = s.conn();
    oka(
        &mut c,
        0,
        &[
            "QUOTA.SET",
            "w",
            "WINDOW",
            "1000000",
            "60000",
            "PRECISION",
            "1000",
        ],
    );
    // A full window: one call in each of its 61 buckets.
    for t in 0..61 {
        oka(&mut c, t * 1000, &["QUOTA.WINDOW", "w"]);
    }
    let used = int(&ok(&mut c, &["MEMORY", "USAGE", "w"]));
    assert!(used <= 1024, "MEMORY USAGE {used}");
}

// ---- replication and AOF ----------------------------------------------------------------

/// A small deterministic PRNG (xorshift) so failures replay from the seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random multi-key workload over budgets and configured windows, on the wall clock (no
/// AT: replicas must apply the master's time) with short TTLs and windows, so reservations
/// expire and ids leave their windows while it runs.
fn multi_workload(c: &mut redis::Connection, seed: u64, ops: usize) {
    let mut rng = Rng(seed | 1);
    let keys = [
        "m:{a}:b1",
        "m:{a}:b2",
        "m:{a}:conc",
        "m:{a}:rpm",
        "m:{a}:tpm",
    ];
    ok(c, &["QUOTA.SET", keys[0], "LIMIT", "100000", "TTL", "40"]);
    ok(c, &["QUOTA.SET", keys[1], "LIMIT", "3000", "TTL", "40"]);
    ok(c, &["QUOTA.SET", keys[2], "LIMIT", "4", "TTL", "30"]);
    ok(
        c,
        &[
            "QUOTA.SET",
            keys[3],
            "WINDOW",
            "20",
            "200",
            "PRECISION",
            "10",
        ],
    );
    ok(c, &["QUOTA.SET", keys[4], "WINDOW", "5000", "100"]);
    let mut ids: Vec<(Vec<usize>, String)> = Vec::new();
    for i in 0..ops {
        // A random non-empty subset of the keys, in random order.
        let mut subset: Vec<usize> = (0..keys.len()).filter(|_| rng.below(2) == 0).collect();
        if subset.is_empty() {
            subset.push(rng.below(keys.len() as u64) as usize);
        }
        if rng.below(2) == 0 {
            subset.reverse();
        }
        let names: Vec<&str> = subset.iter().map(|&k| keys[k]).collect();
        let n = names.len().to_string();
        match rng.below(10) {
            0..=4 => {
                let amounts: Vec<String> = subset
                    .iter()
                    .map(|&k| {
                        if k == 2 || k == 3 {
                            "1".into()
                        } else {
                            rng.below(400).to_string()
                        }
                    })
                    .collect();
                let mut args = vec!["QUOTA.MRESERVE", &n];
                args.extend(&names);
                args.extend(amounts.iter().map(String::as_str));
                let own = format!("c-{i}");
                if rng.below(3) == 0 {
                    args.extend(["ID", &own]);
                }
                let ttl = (5 + rng.below(40)).to_string();
                args.extend(["TTL", &ttl]);
                if let Ok(v) = q(c, &args) {
                    let v = items(&v);
                    if int(&v[0]) == 1 {
                        ids.push((subset.clone(), text(&v[1])));
                    }
                }
            }
            5..=6 if !ids.is_empty() => {
                let (ks, id) = ids.swap_remove(rng.below(ids.len() as u64) as usize);
                let names: Vec<&str> = ks.iter().map(|&k| keys[k]).collect();
                let n = names.len().to_string();
                let actuals: Vec<String> = ks.iter().map(|_| rng.below(500).to_string()).collect();
                let mut args = vec!["QUOTA.MSETTLE", &n];
                args.extend(&names);
                args.push(&id);
                args.extend(actuals.iter().map(String::as_str));
                let _ = q(c, &args);
            }
            7 if !ids.is_empty() => {
                let (ks, id) = ids.swap_remove(rng.below(ids.len() as u64) as usize);
                let names: Vec<&str> = ks.iter().map(|&k| keys[k]).collect();
                let n = names.len().to_string();
                let mut args = vec!["QUOTA.MROLLBACK", &n];
                args.extend(&names);
                args.push(&id);
                let _ = q(c, &args);
            }
            8 if !ids.is_empty() => {
                let (ks, id) = &ids[rng.below(ids.len() as u64) as usize];
                let names: Vec<&str> = ks.iter().map(|&k| keys[k]).collect();
                let n = names.len().to_string();
                let mut args = vec!["QUOTA.MEXTEND", &n];
                args.extend(&names);
                args.extend([id.as_str(), "30"]);
                let _ = q(c, &args);
            }
            _ => {
                let k = if rng.below(2) == 0 { keys[3] } else { keys[4] };
                let cost = rng.below(50).to_string();
                let _ = q(c, &["QUOTA.WINDOW", k, "COST", &cost]);
            }
        }
        if i % 50 == 0 {
            std::thread::sleep(Duration::from_millis(3));
        }
    }
}

fn wait_rewrite(c: &mut redis::Connection) {
    for _ in 0..400 {
        let info: String = redis::cmd("INFO").arg("persistence").query(c).unwrap();
        if info.contains("aof_rewrite_in_progress:0") && !info.contains("aof_rewrite_scheduled:1") {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("AOF rewrite did not finish");
}

#[test]
fn replica_and_aof_replays_are_digest_equal_after_a_multi_key_workload() {
    for preamble in ["no", "yes"] {
        // The sweeper is off at every start (a restart must not release anything before the
        // comparison) and on while the workload runs.
        let mut master = Server::start_with_module_args(
            &[
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--aof-use-rdb-preamble",
                preamble,
            ],
            &["sweep-effort", "0"],
        );
        let replica = Server::start(&[]);
        replica.replicate_from(&master);
        let mut m = master.conn();
        ok(&mut m, &["CONFIG", "SET", "quota.sweep-effort", "1000"]);
        multi_workload(&mut m, 19 + preamble.len() as u64, 1500);
        let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
        assert_eq!(acked, 1);
        // The sweeper may write while we compare: pause it (no new writes on the master).
        ok(&mut m, &["CONFIG", "SET", "quota.sweep-effort", "0"]);
        let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
        let on_master = all_digests(&mut m);
        assert_eq!(on_master.len(), 5);
        let mut r = replica.conn();
        assert_eq!(
            on_master,
            all_digests(&mut r),
            "replica (preamble {preamble})"
        );
        // Replay of the incremental AOF.
        master.restart();
        let mut m = master.conn();
        assert_eq!(
            on_master,
            all_digests(&mut m),
            "AOF replay (preamble {preamble})"
        );
        // Rewrite (QUOTA.LOAD at encoding 2, or the RDB preamble), then replay it.
        ok(&mut m, &["BGREWRITEAOF"]);
        wait_rewrite(&mut m);
        master.restart();
        let mut m = master.conn();
        assert_eq!(
            on_master,
            all_digests(&mut m),
            "rewritten AOF (preamble {preamble})"
        );
        ok(&mut m, &["DEBUG", "RELOAD"]);
        assert_eq!(on_master, all_digests(&mut m), "DEBUG RELOAD");
        for k in ["m:{a}:rpm", "m:{a}:tpm"] {
            assert_eq!(int(&ok(&mut m, &["PTTL", k])), -1, "{k} must not expire");
        }
    }
}

/// Every key count from 1 to 16 (a budget and a window key in turn) is replicated as one
/// `QUOTA.MAPPLY` naming each key: the replica and the AOF replay reach the master's digests.
/// (The replication's format is built per count: one `s` per key.)
#[test]
fn one_to_sixteen_keys_each_replicate_as_one_mapply_line() {
    let mut master =
        Server::start_with_module_args(&PLAIN_AOF, &["test-clock", "yes", "sweep-effort", "0"]);
    let replica = Server::start(&[]);
    replica.replicate_from(&master);
    let mut c = master.conn();
    let names: Vec<String> = (0..16).map(|i| format!("n:{{t}}:k{i}")).collect();
    for (i, k) in names.iter().enumerate() {
        if i % 2 == 0 {
            oka(&mut c, 0, &["QUOTA.SET", k, "LIMIT", "1000"]);
        } else {
            oka(&mut c, 0, &["QUOTA.SET", k, "WINDOW", "1000", "60000"]);
        }
    }
    for n in 1..=16usize {
        let mut args = vec!["QUOTA.MRESERVE".to_string(), n.to_string()];
        args.extend(names.iter().take(n).cloned());
        args.extend((0..n).map(|_| "1".to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = items(&oka(&mut c, 1, &args));
        assert_eq!(int(&r[0]), 1, "{n} keys");
        // The first key (a budget) has given 1 to each of the n requests so far.
        assert_eq!(ints(&r[4]).len(), n);
        assert_eq!(ints(&r[4])[0], 1000 - n as i64, "{n} keys");
    }
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut c).unwrap();
    assert_eq!(acked, 1);
    let before = digests(&mut c);
    assert_eq!(before.len(), 16);
    assert_eq!(before, digests(&mut replica.conn()), "replica");
    let aof = incr_aof(&master);
    assert_eq!(
        String::from_utf8_lossy(&aof)
            .matches("QUOTA.MAPPLY")
            .count(),
        16
    );
    master.restart();
    assert_eq!(before, digests(&mut master.conn()), "AOF replay");
}

/// Several multi-key writes of one `MULTI`/`EXEC` or one script are propagated together at its
/// end (each `QUOTA.MAPPLY` with the same shared `numkeys` string): the replica and the AOF
/// replay reach the master's digests, in the compact form (reservations) and the per-key one
/// (settles) alike.
#[test]
fn multi_key_writes_in_a_transaction_or_a_script_replicate_each() {
    let mut master =
        Server::start_with_module_args(&PLAIN_AOF, &["test-clock", "yes", "sweep-effort", "0"]);
    let replica = Server::start(&[]);
    replica.replicate_from(&master);
    let mut c = master.conn();
    setup(&mut c);
    let (t1, t2) = (at(1), at(2));
    let reserve = |id: &'static str, t: &str| {
        let mut args = vec![
            "QUOTA.MRESERVE",
            "3",
            KEYS[0],
            KEYS[1],
            KEYS[4],
            "5",
            "1",
            "5",
        ];
        args.extend(["ID", id, "AT"]);
        args.push(t);
        args.iter()
            .map(ToString::to_string)
            .collect::<Vec<String>>()
    };
    let mut pipe = redis::pipe();
    pipe.atomic();
    for id in ["x1", "x2"] {
        pipe.cmd("QUOTA.MRESERVE").arg(&reserve(id, &t1)[1..]);
    }
    pipe.cmd("QUOTA.MSETTLE").arg(
        &[
            "3", KEYS[0], KEYS[1], KEYS[4], "x1", "4", "1", "4", "AT", &t1,
        ][..],
    );
    let replies: Vec<Value> = pipe.query(&mut c).unwrap();
    assert_eq!(replies.len(), 3);
    let script = "redis.call('QUOTA.MRESERVE', unpack(ARGV, 1, 11)) \
                  return redis.call('QUOTA.MRESERVE', unpack(ARGV, 12, 22))";
    let mut args = reserve("y1", &t2)[1..].to_vec();
    args.extend(reserve("y2", &t2)[1..].iter().cloned());
    let granted: Value = redis::cmd("EVAL")
        .arg(script)
        .arg(0)
        .arg(&args)
        .query(&mut c)
        .unwrap();
    assert_eq!(int(&items(&granted)[0]), 1);
    assert_eq!(
        info_at(&mut c, KEYS[0], T0 + 2)["reserved"],
        5 + 5 + 5,
        "x2, y1 and y2 pending"
    );
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut c).unwrap();
    assert_eq!(acked, 1);
    let before = digests(&mut c);
    assert_eq!(before, digests(&mut replica.conn()), "replica");
    let aof = String::from_utf8_lossy(&incr_aof(&master)).into_owned();
    assert_eq!(aof.matches("QUOTA.MAPPLY").count(), 5, "{aof}");
    master.restart();
    assert_eq!(before, digests(&mut master.conn()), "AOF replay");
}

/// A multi-key write goes to the AOF (and replicas) as one `QUOTA.MAPPLY` line carrying every
/// key's effects, not one `QUOTA.APPLY` / `QUOTA.WAPPLY` per key; the AOF replays it to the
/// same state. A client cannot send it, and a malformed line changes nothing.
#[test]
fn a_multi_key_write_is_one_mapply_line_replayed_from_the_aof() {
    let mut s = Server::start_with_module_args(&PLAIN_AOF, &["test-clock", "yes"]);
    let mut c = s.conn();
    setup(&mut c);
    mreserve(&mut c, 1, [10, 20, 30, 1, 100, 1], Some("r1"));
    let settled = oka(
        &mut c,
        2,
        &[
            "QUOTA.MSETTLE",
            "6",
            KEYS[0],
            KEYS[1],
            KEYS[2],
            KEYS[3],
            KEYS[4],
            KEYS[5],
            "r1",
            "5",
            "5",
            "5",
            "1",
            "60",
            "0",
        ],
    );
    assert_eq!(items(&settled).len(), 6);
    let before = digests(&mut c);
    let aof = incr_aof(&s);
    let aof = String::from_utf8_lossy(&aof);
    assert_eq!(aof.matches("QUOTA.MAPPLY").count(), 2, "{aof}");
    // QUOTA.SET's lines only: none per key from the two multi-key writes.
    assert_eq!(aof.matches("QUOTA.APPLY").count(), 4, "{aof}");
    assert_eq!(aof.matches("QUOTA.WAPPLY").count(), 2, "{aof}");
    assert!(!aof.contains("MULTI"), "{aof}");
    s.restart();
    let mut c = s.conn();
    assert_eq!(before, digests(&mut c), "AOF replay");
    // Internal: refused from a client, whatever it carries.
    for args in [
        &["QUOTA.MAPPLY", "1", KEYS[0], "B 3:1 x"][..],
        &["QUOTA.MAPPLY", "2", KEYS[0], KEYS[1], "B 3:1 x W 3:1 y"],
        &["QUOTA.MAPPLY", "0", "x", "y"],
    ] {
        let (code, msg) = err(&mut c, args);
        assert_eq!(code, "ERR", "{args:?}");
        assert!(msg.contains("internal"), "{args:?}: {msg}");
    }
    assert_eq!(before, digests(&mut c));
}

/// The active sweeper forgets a window key's ids once their bucket has left the window, in a
/// key nobody writes to any more, and replicates it (the replica's key ends equal).
#[test]
fn the_sweeper_forgets_window_ids_whose_bucket_left_the_window() {
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    replica.replicate_from(&master);
    let mut m = master.conn();
    ok(
        &mut m,
        &["QUOTA.SET", "w", "WINDOW", "100", "200", "PRECISION", "10"],
    );
    ok(&mut m, &["QUOTA.SET", "b", "LIMIT", "100"]);
    for id in ["a", "b", "c"] {
        let r = ok(
            &mut m,
            &["QUOTA.MRESERVE", "2", "w", "b", "1", "1", "ID", id],
        );
        assert_eq!(int(&items(&r)[0]), 1);
    }
    assert_eq!(info(&mut m, "w")["remembered_ids"], 3);
    let mut gone = false;
    for _ in 0..200 {
        if info(&mut m, "w")["remembered_ids"] == 0 {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(gone, "the sweeper did not forget the ids");
    // The window counted them, the budget still holds them: only the ids went.
    assert_eq!(info(&mut m, "b")["reserved"], 3);
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(acked, 1);
    let mut r = replica.conn();
    assert_eq!(digest(&mut m, "w"), digest(&mut r, "w"));
    assert_eq!(info(&mut r, "w")["remembered_ids"], 0);
}

/// MEMORY USAGE of a window key holding 20 000 remembered ids is within 10 % of what deleting
/// it gives back: client ids of 16 bytes (stored in the queue's slots, found through a table:
/// at most 64 bytes an id) and of 36 (a UUID's length: each one allocation of its own
/// besides), and generated ids (the queue in id order, no table: at most 48 bytes an id).
#[test]
fn memory_usage_of_remembered_ids_is_within_10_percent() {
    let s = server();
    let n = 20_000usize;
    type Case = (&'static str, Option<fn(usize) -> String>, i64);
    let cases: [Case; 3] = [
        ("w", Some(|i| format!("request-{i:08}")), 64),
        (
            "w-long",
            Some(|i| format!("{i:08}-0000-4000-8000-000000000000")),
            64 + 48,
        ),
        ("w-generated", None, 48),
    ];
    for (key, id, max_per_id) in cases {
        {
            let mut c = s.conn();
            oka(
                &mut c,
                0,
                &[
                    "QUOTA.SET",
                    key,
                    "WINDOW",
                    "1000000000",
                    "600000",
                    "PRECISION",
                    "10000",
                ],
            );
            let empty = int(&ok(&mut c, &["MEMORY", "USAGE", key]));
            let mut pipe = redis::pipe();
            for i in 0..n {
                pipe.cmd("QUOTA.MRESERVE").arg(1).arg(key).arg(1);
                if let Some(id) = id {
                    pipe.arg("ID").arg(id(i));
                }
                pipe.arg("AT").arg(at(i as i64));
            }
            let replies: Vec<Value> = pipe.query(&mut c).unwrap();
            assert!(replies.iter().all(|r| int(&items(r)[0]) == 1));
            assert_eq!(
                info_at(&mut c, key, T0 + n as i64)["remembered_ids"],
                n as i64
            );
            let full = int(&ok(&mut c, &["MEMORY", "USAGE", key]));
            let per_id = (full - empty) / n as i64;
            eprintln!("{key}: MEMORY USAGE {full} B, {per_id} B per remembered id");
            assert!(per_id <= max_per_id, "{key}: {per_id} bytes per id");
        }
        // A fresh connection: the pipelining client's buffers would move used_memory meanwhile.
        std::thread::sleep(Duration::from_millis(50));
        let c = &mut s.conn();
        settled_used_memory(c);
        let reported = int(&ok(c, &["MEMORY", "USAGE", key]));
        let before = used_memory(c);
        ok(c, &["DEL", key]);
        let freed = before - used_memory(c);
        let ratio = reported as f64 / freed as f64;
        eprintln!("{key}: MEMORY USAGE {reported} B, freed by DEL {freed} B, ratio {ratio:.3}");
        assert!(
            (0.9..=1.1).contains(&ratio),
            "{key}: MEMORY USAGE {reported} vs freed {freed}"
        );
    }
}

/// A key deleted or replaced between reserve and settle (the documented behaviour): a missing
/// key is NOQUOTA and nothing changes anywhere; a replaced budget does not know the id
/// (NORESERVATION); a replaced window key skips it.
#[test]
fn deleted_or_replaced_keys_between_reserve_and_settle() {
    let s = server();
    let mut c = s.conn();
    setup(&mut c);
    mreserve(&mut c, 0, [5, 5, 5, 1, 5, 1], Some("d"));
    ok(&mut c, &["DEL", KEYS[1]]);
    let before = digests(&mut c);
    let (code, _) = erra(
        &mut c,
        1,
        &[
            "QUOTA.MSETTLE",
            "3",
            KEYS[0],
            KEYS[1],
            KEYS[4],
            "d",
            "1",
            "1",
            "1",
        ],
    );
    assert_eq!(code, "NOQUOTA");
    assert_eq!(before, digests(&mut c));
    // Replaced: a new budget and a new window key at the same names.
    oka(&mut c, 1, &["QUOTA.SET", KEYS[1], "LIMIT", "50000"]);
    ok(&mut c, &["DEL", KEYS[4]]);
    oka(
        &mut c,
        1,
        &[
            "QUOTA.SET",
            KEYS[4],
            "WINDOW",
            "5000",
            "60000",
            "PRECISION",
            "1000",
        ],
    );
    let before = digests(&mut c);
    let (code, _) = erra(
        &mut c,
        2,
        &[
            "QUOTA.MSETTLE",
            "3",
            KEYS[0],
            KEYS[1],
            KEYS[4],
            "d",
            "1",
            "1",
            "1",
        ],
    );
    assert_eq!(code, "NORESERVATION");
    assert_eq!(before, digests(&mut c));
    // Without the replaced budget: the window skips, the others settle.
    let r = items(&oka(
        &mut c,
        2,
        &[
            "QUOTA.MSETTLE",
            "3",
            KEYS[0],
            KEYS[4],
            KEYS[5],
            "d",
            "1",
            "1",
            "0",
        ],
    ));
    let statuses: Vec<String> = r.iter().map(|v| text(&items(v)[0])).collect();
    assert_eq!(statuses, ["settled", "skipped", "settled"]);
}

/// The keyspace events of each key, and the cap on a window's remembered ids
/// (`quota.max-pending`, LIMIT, nothing changes).
#[test]
fn events_per_key_and_the_cap_on_remembered_ids() {
    let s = server();
    let mut c = s.conn();
    ok(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "Kd"]);
    let mut sub = s.conn();
    let mut pubsub = sub.as_pubsub();
    pubsub.psubscribe("__keyspace@0__:*").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    oka(&mut c, 0, &["QUOTA.SET", "b", "LIMIT", "100"]);
    oka(&mut c, 0, &["QUOTA.SET", "w", "WINDOW", "100", "60000"]);
    oka(
        &mut c,
        1,
        &["QUOTA.MRESERVE", "2", "b", "w", "5", "5", "ID", "e"],
    );
    oka(&mut c, 2, &["QUOTA.MSETTLE", "2", "b", "w", "e", "3", "3"]);
    oka(
        &mut c,
        3,
        &["QUOTA.MRESERVE", "2", "b", "w", "1", "1", "ID", "f"],
    );
    oka(&mut c, 4, &["QUOTA.MROLLBACK", "2", "b", "w", "f"]);
    // A denial publishes nothing.
    oka(&mut c, 5, &["QUOTA.MRESERVE", "2", "b", "w", "1", "1000"]);
    ok(&mut c, &["PUBLISH", "__keyspace@0__:end", "end"]);
    let mut got = Vec::new();
    loop {
        let m = pubsub.get_message().unwrap();
        let payload: String = m.get_payload().unwrap();
        if payload == "end" {
            break;
        }
        let key = m
            .get_channel_name()
            .trim_start_matches("__keyspace@0__:")
            .to_string();
        got.push(format!("{key} {payload}"));
    }
    assert_eq!(
        got,
        [
            "b quota.set",
            "w quota.set",
            "b quota.reserve",
            "w quota.window",
            "b quota.settle",
            "w quota.settle",
            "b quota.reserve",
            "w quota.window",
            "b quota.rollback",
            "w quota.rollback",
        ]
    );
    drop(pubsub);
    // The cap: 3 ids per key (finished ids still in the window count: e and f are held).
    ok(&mut c, &["CONFIG", "SET", "quota.max-pending", "3"]);
    oka(&mut c, 6, &["QUOTA.MRESERVE", "1", "w", "1", "ID", "g"]);
    let before = digest(&mut c, "w");
    let (code, msg) = erra(&mut c, 7, &["QUOTA.MRESERVE", "1", "w", "1", "ID", "h"]);
    assert_eq!(code, "LIMIT");
    assert!(
        msg.contains("too many remembered ids on this window key (max 3, finished ones"),
        "{msg}"
    );
    assert_eq!(before, digest(&mut c, "w"));
}

/// On a (one-node) cluster the key spec routes the multi-key commands: keys in different
/// slots are CROSSSLOT, keys sharing the tenant's hash tag run.
#[test]
fn cluster_refuses_cross_slot_and_runs_one_tenant() {
    let s = Server::start(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
    ]);
    let mut c = s.conn();
    ok(&mut c, &["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
    let mut up = false;
    for _ in 0..200 {
        let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut c).unwrap();
        if info.contains("cluster_state:ok") {
            up = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(up, "cluster did not come up");
    ok(
        &mut c,
        &["QUOTA.SET", "quota:{t_1001}:key:k9:day", "LIMIT", "100"],
    );
    ok(
        &mut c,
        &["QUOTA.SET", "quota:{t_1001}:rpm", "WINDOW", "10", "60000"],
    );
    ok(
        &mut c,
        &["QUOTA.SET", "quota:{t_2002}:rpm", "WINDOW", "10", "60000"],
    );
    let r = ok(
        &mut c,
        &[
            "QUOTA.MRESERVE",
            "2",
            "quota:{t_1001}:key:k9:day",
            "quota:{t_1001}:rpm",
            "5",
            "1",
        ],
    );
    assert_eq!(int(&items(&r)[0]), 1);
    for args in [
        vec![
            "QUOTA.MRESERVE",
            "2",
            "quota:{t_1001}:key:k9:day",
            "quota:{t_2002}:rpm",
            "5",
            "1",
        ],
        vec![
            "QUOTA.MSETTLE",
            "2",
            "quota:{t_1001}:key:k9:day",
            "quota:{t_2002}:rpm",
            "x",
            "1",
            "1",
        ],
        vec![
            "QUOTA.MROLLBACK",
            "2",
            "quota:{t_1001}:key:k9:day",
            "quota:{t_2002}:rpm",
            "x",
        ],
        vec![
            "QUOTA.MEXTEND",
            "2",
            "quota:{t_1001}:key:k9:day",
            "quota:{t_2002}:rpm",
            "x",
            "10",
        ],
    ] {
        assert_eq!(err(&mut c, &args).0, "CROSSSLOT", "{args:?}");
    }
}

/// A new `ID` longer than `quota.max-id-length` is refused whatever keys are listed, window
/// keys alone included, and changes nothing; with a window key's ids at `quota.max-pending`,
/// ids whose bucket left the window no longer count.
#[test]
fn window_keys_alone_keep_the_id_rules() {
    let s = server();
    let mut c = s.conn();
    oka(
        &mut c,
        0,
        &[
            "QUOTA.SET",
            "w",
            "WINDOW",
            "100",
            "1000",
            "PRECISION",
            "100",
        ],
    );
    oka(&mut c, 0, &["QUOTA.SET", "b", "LIMIT", "100"]);
    let long = "x".repeat(129);
    let before = digests(&mut c);
    for args in [
        &["QUOTA.MRESERVE", "1", "w", "1", "ID", &long][..],
        &["QUOTA.MRESERVE", "2", "w", "b", "1", "1", "ID", &long][..],
    ] {
        let (code, msg) = erra(&mut c, 1, args);
        assert_eq!(code, "ERR", "{msg}");
        assert!(msg.contains("longer than 128 bytes"), "{msg}");
    }
    assert_eq!(before, digests(&mut c));
    let fits = "x".repeat(128);
    let r = oka(&mut c, 1, &["QUOTA.MRESERVE", "1", "w", "1", "ID", &fits]);
    assert_eq!(int(&items(&r)[0]), 1);

    q(&mut c, &["CONFIG", "SET", "quota.max-pending", "2"]).unwrap();
    let r = oka(&mut c, 2, &["QUOTA.MRESERVE", "1", "w", "1"]);
    assert_eq!(int(&items(&r)[0]), 1);
    let (code, _) = erra(&mut c, 3, &["QUOTA.MRESERVE", "1", "w", "1"]);
    assert_eq!(code, "LIMIT");
    // A second later both ids' bucket has left the window: the cap counts none of them.
    let r = oka(&mut c, 1_200, &["QUOTA.MRESERVE", "1", "w", "1"]);
    assert_eq!(int(&items(&r)[0]), 1);
    q(&mut c, &["CONFIG", "SET", "quota.max-pending", "1000000"]).unwrap();
}
