//! The usage log (issue 21): `QUOTA.SET ... STREAM key [STREAMMAXLEN n]`. One stream entry per
//! event that finishes a reservation or changes `used`, with exact fields; nothing for
//! denials, duplicates, reads and errors; replicas, AOF replays and DEBUG RELOAD hold the same
//! stream as the master; the cluster same-slot rule; trimming.

mod common;
use common::*;
use std::time::{Duration, Instant};

/// 2100-01-01T00:00Z: the start of a UTC day.
const T: i64 = 4_102_444_800_000;
const DAY: i64 = 86_400_000;

fn clock_server(args: &[&str]) -> Server {
    Server::start_with_module_args(args, &["test-clock", "yes", "sweep-effort", "0"])
}

fn at(t: i64) -> String {
    t.to_string()
}

/// One entry's fields in the module's order, as text: (key, event, id, held, charged, used,
/// period_start, at).
type Fields = Vec<(String, String)>;

fn entries(c: &mut redis::Connection, stream: &str) -> Vec<(String, Fields)> {
    items(&ok(c, &["XRANGE", stream, "-", "+"]))
        .into_iter()
        .map(|e| {
            let e = items(&e);
            let kv = items(&e[1])
                .chunks(2)
                .map(|p| (text(&p[0]), text(&p[1])))
                .collect();
            (text(&e[0]), kv)
        })
        .collect()
}

/// The expected fields of an entry of budget `key`.
#[allow(clippy::too_many_arguments)]
fn entry(
    key: &str,
    event: &str,
    id: &str,
    held: i64,
    charged: i64,
    used: i64,
    period_start: i64,
    at: i64,
) -> Fields {
    [
        ("key", key.to_string()),
        ("event", event.to_string()),
        ("id", id.to_string()),
        ("held", held.to_string()),
        ("charged", charged.to_string()),
        ("used", used.to_string()),
        ("period_start", period_start.to_string()),
        ("at", at.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn xlen(c: &mut redis::Connection, stream: &str) -> i64 {
    int(&ok(c, &["XLEN", stream]))
}

#[test]
fn every_event_kind_logs_one_entry_with_exact_fields() {
    let s = clock_server(&[]);
    let mut c = s.conn();
    let (b, u) = ("{t}:b", "{t}:usage");
    // A new budget logs its starting USED as an adjustment.
    ok(
        &mut c,
        &[
            "QUOTA.SET",
            b,
            "LIMIT",
            "100",
            "USED",
            "5",
            "PERIOD",
            "DAY",
            "STREAM",
            u,
            "AT",
            &at(T),
        ],
    );
    ok(
        &mut c,
        &["QUOTA.RESERVE", b, "10", "ID", "r1", "AT", &at(T + 1)],
    );
    ok(&mut c, &["QUOTA.SETTLE", b, "r1", "7", "AT", &at(T + 2)]);
    // A retried SETTLE, a denial, reads and errors append nothing.
    let before = xlen(&mut c, u);
    let r = items(&ok(
        &mut c,
        &["QUOTA.SETTLE", b, "r1", "7", "AT", &at(T + 3)],
    ));
    assert_eq!(text(&r[0]), "duplicate");
    let r = items(&ok(&mut c, &["QUOTA.RESERVE", b, "1000", "AT", &at(T + 3)]));
    assert_eq!(int(&r[0]), 0);
    let r = items(&ok(&mut c, &["QUOTA.CHARGE", b, "1000", "AT", &at(T + 3)]));
    assert_eq!(int(&r[0]), 0);
    err(&mut c, &["QUOTA.SETTLE", b, "nope", "1", "AT", &at(T + 3)]);
    err(&mut c, &["QUOTA.SETTLE", b, "r1", "8", "AT", &at(T + 3)]);
    ok(&mut c, &["QUOTA.INFO", b, "AT", &at(T + 3)]);
    ok(&mut c, &["QUOTA.PENDING", b, "AT", &at(T + 3)]);
    ok(&mut c, &["QUOTA.SET", b, "LIMIT", "100", "AT", &at(T + 3)]);
    assert_eq!(xlen(&mut c, u), before);

    ok(
        &mut c,
        &["QUOTA.RESERVE", b, "10", "ID", "r2", "AT", &at(T + 4)],
    );
    ok(&mut c, &["QUOTA.ROLLBACK", b, "r2", "AT", &at(T + 5)]);
    // A duplicate rollback appends nothing.
    ok(&mut c, &["QUOTA.ROLLBACK", b, "r2", "AT", &at(T + 5)]);
    // Expired, then settled late: the write releases it first.
    ok(
        &mut c,
        &[
            "QUOTA.RESERVE",
            b,
            "4",
            "ID",
            "r3",
            "TTL",
            "10",
            "AT",
            &at(T + 6),
        ],
    );
    let r = items(&ok(
        &mut c,
        &["QUOTA.SETTLE", b, "r3", "6", "AT", &at(T + 100)],
    ));
    assert_eq!(text(&r[0]), "late");
    // Expired and released by another write's maintenance, then a charge with an id.
    ok(
        &mut c,
        &[
            "QUOTA.RESERVE",
            b,
            "3",
            "ID",
            "r4",
            "TTL",
            "10",
            "AT",
            &at(T + 200),
        ],
    );
    ok(
        &mut c,
        &["QUOTA.CHARGE", b, "2", "ID", "c1", "AT", &at(T + 300)],
    );
    // A retried charge appends nothing.
    ok(
        &mut c,
        &["QUOTA.CHARGE", b, "2", "ID", "c1", "AT", &at(T + 300)],
    );
    ok(
        &mut c,
        &["QUOTA.CHARGE", b, "1000", "FORCE", "AT", &at(T + 301)],
    );
    // An adjustment logs the delta.
    ok(&mut c, &["QUOTA.SET", b, "USED", "50", "AT", &at(T + 302)]);
    // The next day: the write that resets logs the closing used, then its own charge.
    ok(&mut c, &["QUOTA.CHARGE", b, "1", "AT", &at(T + DAY + 5)]);

    let got: Vec<Fields> = entries(&mut c, u).into_iter().map(|(_, f)| f).collect();
    let want = vec![
        entry(b, "adjust", "", -1, 5, 5, T, T),
        entry(b, "settle", "r1", 10, 7, 12, T, T + 2),
        entry(b, "rollback", "r2", 10, 0, 12, T, T + 5),
        entry(b, "expire", "r3", 4, 0, 12, T, T + 100),
        entry(b, "late_settle", "r3", 4, 6, 18, T, T + 100),
        entry(b, "expire", "r4", 3, 0, 18, T, T + 300),
        entry(b, "charge", "c1", -1, 2, 20, T, T + 300),
        entry(b, "forced_charge", "", -1, 1000, 1020, T, T + 301),
        entry(b, "adjust", "", -1, -970, 50, T, T + 302),
        entry(b, "reset", "", -1, 0, 50, T, T + DAY + 5),
        entry(b, "charge", "", -1, 1, 1, T + DAY, T + DAY + 5),
    ];
    assert_eq!(got, want);

    // The sum of the charged amounts in the current period is `used`.
    let i = info_at(&mut c, b, T + DAY + 6);
    let start = i["period_start_ms"];
    let sum: i64 = got
        .iter()
        .filter(|f| f[6].1 == start.to_string())
        .map(|f| f[4].1.parse::<i64>().unwrap())
        .sum();
    assert_eq!(sum, i["used"]);
    // And over the first day, it is that day's closing used.
    let day1: i64 = got
        .iter()
        .filter(|f| f[6].1 == T.to_string() && f[1].1 != "reset")
        .map(|f| f[4].1.parse::<i64>().unwrap())
        .sum();
    assert_eq!(day1, 50);

    // QUOTA.INFO names the stream and its MAXLEN (the default).
    let v = items(&ok(&mut c, &["QUOTA.INFO", b, "AT", &at(T + DAY + 6)]));
    let f: Vec<String> = v
        .iter()
        .map(|x| match x {
            Value::Int(n) => n.to_string(),
            other => text(other),
        })
        .collect();
    let pos = f.iter().position(|x| x == "stream").unwrap();
    assert_eq!(f[pos + 1], u);
    assert_eq!(f[pos + 2..pos + 4], ["stream_maxlen", "1000000"]);
}

#[test]
fn stream_off_logs_nothing_and_settings_are_checked() {
    let s = clock_server(&[]);
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "b", "LIMIT", "100", "AT", &at(T)]);
    ok(&mut c, &["QUOTA.CHARGE", "b", "1", "AT", &at(T)]);
    assert_eq!(int(&ok(&mut c, &["EXISTS", "u"])), 0);
    // STREAMMAXLEN needs a stream; a negative one is refused; neither changes anything.
    let d = digest(&mut c, "b");
    assert!(err(&mut c, &["QUOTA.SET", "b", "STREAMMAXLEN", "5"])
        .1
        .contains("STREAM key"));
    err(
        &mut c,
        &["QUOTA.SET", "b", "STREAM", "u", "STREAMMAXLEN", "-1"],
    );
    // Another type at the stream key, or the budget key itself, is refused.
    ok(&mut c, &["SET", "str", "x"]);
    assert_eq!(
        err(&mut c, &["QUOTA.SET", "b", "STREAM", "str"]).0,
        "WRONGTYPE"
    );
    err(&mut c, &["QUOTA.SET", "b", "STREAM", "b"]);
    assert_eq!(digest(&mut c, "b"), d);

    ok(
        &mut c,
        &[
            "QUOTA.SET",
            "b",
            "STREAM",
            "u",
            "STREAMMAXLEN",
            "7",
            "AT",
            &at(T + 1),
        ],
    );
    assert_eq!(info_at(&mut c, "b", T + 1)["stream_maxlen"], 7);
    // Turning the log on logs nothing by itself.
    assert_eq!(int(&ok(&mut c, &["EXISTS", "u"])), 0);
    ok(&mut c, &["QUOTA.CHARGE", "b", "2", "AT", &at(T + 2)]);
    assert_eq!(xlen(&mut c, "u"), 1);
    // STREAMMAXLEN alone changes the MAXLEN; STREAM alone keeps it.
    ok(
        &mut c,
        &["QUOTA.SET", "b", "STREAMMAXLEN", "0", "AT", &at(T + 3)],
    );
    ok(
        &mut c,
        &["QUOTA.SET", "b", "STREAM", "u2", "AT", &at(T + 3)],
    );
    assert_eq!(info_at(&mut c, "b", T + 3)["stream_maxlen"], 0);
    ok(&mut c, &["QUOTA.CHARGE", "b", "3", "AT", &at(T + 4)]);
    assert_eq!((xlen(&mut c, "u"), xlen(&mut c, "u2")), (1, 1));

    // The stream key replaced by another type: the write is refused and changes nothing.
    ok(&mut c, &["DEL", "u2"]);
    ok(&mut c, &["SET", "u2", "x"]);
    let d = digest(&mut c, "b");
    assert_eq!(
        err(&mut c, &["QUOTA.CHARGE", "b", "3", "AT", &at(T + 5)]).0,
        "WRONGTYPE"
    );
    assert_eq!(digest(&mut c, "b"), d);
    ok(&mut c, &["DEL", "u2"]);

    // STREAM "" turns it off.
    ok(&mut c, &["QUOTA.SET", "b", "STREAM", "", "AT", &at(T + 6)]);
    ok(&mut c, &["QUOTA.CHARGE", "b", "4", "AT", &at(T + 7)]);
    assert_eq!((xlen(&mut c, "u"), xlen(&mut c, "u2")), (1, 0));
    let i = info_at(&mut c, "b", T + 7);
    assert_eq!(i["stream_maxlen"], -1);
}

/// Waits until the replica has everything the master wrote.
fn sync(m: &mut redis::Connection) {
    let n: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(m).unwrap();
    assert_eq!(n, 1);
}

/// A workload touching every event kind on three budgets sharing and not sharing streams.
fn workload(c: &mut redis::Connection, t0: i64) {
    ok(
        c,
        &[
            "QUOTA.SET",
            "{a}:b",
            "LIMIT",
            "1000",
            "USED",
            "3",
            "PERIOD",
            "HOUR",
            "STREAM",
            "{a}:u",
            "STREAMMAXLEN",
            "10",
            "AT",
            &at(t0),
        ],
    );
    ok(
        c,
        &[
            "QUOTA.SET",
            "{a}:c",
            "LIMIT",
            "50",
            "STREAM",
            "{a}:u",
            "STREAMMAXLEN",
            "10",
            "AT",
            &at(t0),
        ],
    );
    ok(
        c,
        &[
            "QUOTA.SET",
            "x",
            "LIMIT",
            "1000",
            "STREAM",
            "xu",
            "STREAMMAXLEN",
            "0",
            "AT",
            &at(t0),
        ],
    );
    for i in 0..60i64 {
        let t = t0 + i * 60_000;
        for key in ["{a}:b", "{a}:c", "x"] {
            let id = format!("r{i}");
            // Denials and errors (a settle of a denied reservation) are part of the workload.
            let _ = q(
                c,
                &[
                    "QUOTA.RESERVE",
                    key,
                    "5",
                    "ID",
                    &id,
                    "TTL",
                    "90000",
                    "AT",
                    &at(t),
                ],
            );
            let t1 = at(t + 1);
            let _ = match i % 4 {
                0 => q(c, &["QUOTA.SETTLE", key, &id, "4", "AT", &t1]),
                1 => q(c, &["QUOTA.ROLLBACK", key, &id, "AT", &t1]),
                2 => q(
                    c,
                    &["QUOTA.CHARGE", key, "2", "ID", &format!("c{i}"), "AT", &t1],
                ),
                _ => q(c, &["QUOTA.CHARGE", key, "9", "FORCE", "AT", &t1]),
            };
        }
    }
    ok(
        c,
        &["QUOTA.SET", "x", "USED", "1", "AT", &at(t0 + 3_700_000)],
    );
}

/// What XINFO STREAM says of a stream that does not depend on its node size: length, last
/// generated id, max deleted id, entries added, first recorded id.
fn stream_meta(c: &mut redis::Connection, stream: &str) -> Vec<(String, String)> {
    let keep = [
        "length",
        "last-generated-id",
        "max-deleted-entry-id",
        "entries-added",
        "recorded-first-entry-id",
    ];
    items(&ok(c, &["XINFO", "STREAM", stream]))
        .chunks(2)
        .map(|p| (text(&p[0]), p[1].clone()))
        .filter(|(k, _)| keep.contains(&k.as_str()))
        .map(|(k, v)| {
            let v = match v {
                Value::Int(n) => n.to_string(),
                other => text(&other),
            };
            (k, v)
        })
        .collect()
}

#[test]
fn replica_aof_and_reload_hold_the_masters_stream() {
    // Different node sizes: approximate trimming on the master must not depend on them.
    let mut master = clock_server(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--stream-node-max-entries",
        "4",
    ]);
    let replica = clock_server(&["--stream-node-max-entries", "100"]);
    replica.replicate_from(&master);
    let mut m = master.conn();
    let mut r = replica.conn();
    workload(&mut m, T);
    sync(&mut m);
    let want = all_digests(&mut m);
    assert_eq!(keys(&mut m), ["x", "xu", "{a}:b", "{a}:c", "{a}:u"]);
    assert_eq!(all_digests(&mut r), want);
    assert_eq!(entries(&mut r, "{a}:u"), entries(&mut m, "{a}:u"));
    // The master adds its entries through the stream API, not by running XADD; the replica
    // rebuilds them from the effects with the master's ids (`LOGGED` in QUOTA.APPLY): no XADD
    // runs on either.
    let xadds = |c: &mut redis::Connection| {
        let stats: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
        stats.contains("cmdstat_xadd:")
    };
    assert!(!xadds(&mut m));
    assert!(!xadds(&mut r));
    // Trimmed on the master (MAXLEN ~ 10 with 4-entry nodes), the same on the replica.
    let len = xlen(&mut m, "{a}:u");
    assert!((10..=14).contains(&len), "{len}");
    assert!(len < 3 * 60);
    assert_eq!(stream_meta(&mut r, "{a}:u"), stream_meta(&mut m, "{a}:u"));
    assert_eq!(stream_meta(&mut r, "xu"), stream_meta(&mut m, "xu"));
    // STREAMMAXLEN 0: nothing trimmed, and the entries add up to `used`.
    let sp = items(&ok(&mut m, &["XINFO", "STREAM", "xu"]));
    let deleted = sp
        .chunks(2)
        .find(|p| p[0] == Value::BulkString(b"max-deleted-entry-id".to_vec()))
        .map(|p| text(&p[1]));
    assert_eq!(deleted.as_deref(), Some("0-0"));
    let sum: i64 = entries(&mut m, "xu")
        .iter()
        .map(|(_, f)| f[4].1.parse::<i64>().unwrap())
        .sum();
    assert_eq!(sum, info_at(&mut m, "x", T + 3_700_000)["used"]);
    assert!(xlen(&mut m, "xu") > 60);

    ok(&mut m, &["DEBUG", "RELOAD"]);
    assert_eq!(all_digests(&mut m), want);
    // AOF replay, with the RDB preamble and without (QUOTA.LOAD of the budgets).
    master.restart();
    let mut m = master.conn();
    assert_eq!(all_digests(&mut m), want);
    ok(&mut m, &["CONFIG", "SET", "aof-use-rdb-preamble", "no"]);
    ok(&mut m, &["BGREWRITEAOF"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while info_section(&mut m, "persistence")["aof_rewrite_in_progress"] == 1
        || info_section(&mut m, "persistence")["aof_rewrite_scheduled"] == 1
    {
        assert!(Instant::now() < deadline, "rewrite did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
    master.restart();
    let mut m = master.conn();
    assert_eq!(all_digests(&mut m), want);
    assert_eq!(info_at(&mut m, "{a}:b", T + 3_700_000)["stream_maxlen"], 10);
}

#[test]
fn sweeper_expiries_are_logged_and_replicated() {
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    replica.replicate_from(&master);
    let mut m = master.conn();
    let mut r = replica.conn();
    ok(&mut m, &["QUOTA.SET", "b", "LIMIT", "100", "STREAM", "u"]);
    ok(
        &mut m,
        &["QUOTA.RESERVE", "b", "7", "ID", "short", "TTL", "50"],
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while xlen(&mut m, "u") == 0 {
        assert!(
            Instant::now() < deadline,
            "the sweeper did not log the expiry"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let e = entries(&mut m, "u");
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].1[1].1, "expire");
    assert_eq!((e[0].1[2].1.as_str(), e[0].1[3].1.as_str()), ("short", "7"));
    assert_eq!(e[0].1[4].1, "0");
    sync(&mut m);
    assert_eq!(all_digests(&mut r), all_digests(&mut m));
}

#[test]
fn cross_slot_streams_are_refused_in_a_cluster() {
    let s = Server::start(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
    ]);
    let mut c = s.conn();
    ok(&mut c, &["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let i: String = redis::cmd("CLUSTER").arg("INFO").query(&mut c).unwrap();
        if i.contains("cluster_state:ok") {
            break;
        }
        assert!(Instant::now() < deadline, "cluster did not come up: {i}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, msg) = err(
        &mut c,
        &["QUOTA.SET", "{a}:b", "LIMIT", "1", "STREAM", "{b}:u"],
    );
    assert_eq!(code, "CROSSSLOT", "{msg}");
    assert!(msg.contains("hash tag"), "{msg}");
    assert_eq!(int(&ok(&mut c, &["EXISTS", "{a}:b"])), 0);
    // The module's slot agrees with Redis's for keys that share one.
    let slot = |c: &mut redis::Connection, k: &str| int(&ok(c, &["CLUSTER", "KEYSLOT", k]));
    assert_eq!(slot(&mut c, "{a}:b"), slot(&mut c, "{a}:u"));
    assert_ne!(slot(&mut c, "{a}:b"), slot(&mut c, "{b}:u"));
    ok(
        &mut c,
        &["QUOTA.SET", "{a}:b", "LIMIT", "10", "STREAM", "{a}:u"],
    );
    ok(&mut c, &["QUOTA.CHARGE", "{a}:b", "3"]);
    assert_eq!(xlen(&mut c, "{a}:u"), 1);
    // Changing it later is checked the same way.
    assert_eq!(
        err(&mut c, &["QUOTA.SET", "{a}:b", "STREAM", "other"]).0,
        "CROSSSLOT"
    );
    // Without a cluster, any stream key is accepted.
    let plain = Server::start(&[]);
    let mut p = plain.conn();
    ok(
        &mut p,
        &["QUOTA.SET", "{a}:b", "LIMIT", "1", "STREAM", "{b}:u"],
    );
}

#[test]
fn a_user_may_log_only_to_streams_its_key_patterns_allow() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    ok(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "acme",
            "on",
            ">pw",
            "~{acme}:*",
            "+quota.set",
            "+quota.charge",
            "+xlen",
        ],
    );
    let mut c = redis::Client::open(format!("redis://acme:pw@127.0.0.1:{}/", s.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let (code, _) = err(
        &mut c,
        &[
            "QUOTA.SET",
            "{acme}:b",
            "LIMIT",
            "10",
            "STREAM",
            "billing:all",
        ],
    );
    assert_eq!(code, "NOPERM");
    assert_eq!(int(&ok(&mut admin, &["EXISTS", "{acme}:b"])), 0);
    ok(
        &mut c,
        &[
            "QUOTA.SET",
            "{acme}:b",
            "LIMIT",
            "10",
            "STREAM",
            "{acme}:usage",
        ],
    );
    ok(&mut c, &["QUOTA.CHARGE", "{acme}:b", "2"]);
    assert_eq!(int(&ok(&mut c, &["XLEN", "{acme}:usage"])), 1);
    // The admin may point it anywhere.
    ok(
        &mut admin,
        &["QUOTA.SET", "{acme}:b", "STREAM", "billing:all"],
    );
}

#[test]
fn multi_key_settles_log_each_budget_and_a_bad_stream_refuses_them_all() {
    let s = clock_server(&[]);
    let replica = clock_server(&[]);
    replica.replicate_from(&s);
    let mut c = s.conn();
    let t = |d: i64| (T + d).to_string();
    // The first key logs to a stream that stays fine: only the second one's goes bad.
    ok(
        &mut c,
        &[
            "QUOTA.SET",
            "{t}:org",
            "LIMIT",
            "1000",
            "STREAM",
            "{t}:u2",
            "AT",
            &t(0),
        ],
    );
    ok(
        &mut c,
        &[
            "QUOTA.SET",
            "{t}:user",
            "LIMIT",
            "100",
            "STREAM",
            "{t}:u",
            "AT",
            &t(0),
        ],
    );
    ok(
        &mut c,
        &["QUOTA.SET", "{t}:plain", "LIMIT", "100", "AT", &t(0)],
    );
    let keys = ["3", "{t}:org", "{t}:user", "{t}:plain"];
    let mut reserve = vec!["QUOTA.MRESERVE"];
    reserve.extend(keys);
    reserve.extend(["10", "10", "10", "ID", "m1", "AT"]);
    let at1 = t(1);
    reserve.push(&at1);
    ok(&mut c, &reserve);
    // The stream of one key replaced by a string: the whole settle is refused, nothing changes.
    // (The stream does not exist yet: reservations log nothing.)
    assert_eq!(int(&ok(&mut c, &["EXISTS", "{t}:u"])), 0);
    ok(&mut c, &["SET", "{t}:u", "x"]);
    let digests = all_digests(&mut c);
    let mut settle = vec!["QUOTA.MSETTLE"];
    settle.extend(keys);
    settle.extend(["m1", "7", "8", "9", "AT"]);
    let at2 = t(2);
    settle.push(&at2);
    assert_eq!(err(&mut c, &settle).0, "WRONGTYPE");
    assert_eq!(all_digests(&mut c), digests);
    ok(&mut c, &["DEL", "{t}:u"]);
    ok(&mut c, &settle);
    let got = |c: &mut redis::Connection, s: &str| -> Vec<(String, String, String)> {
        entries(c, s)
            .into_iter()
            .map(|(_, f)| (f[0].1.clone(), f[1].1.clone(), f[4].1.clone()))
            .collect()
    };
    assert_eq!(
        got(&mut c, "{t}:u2"),
        [("{t}:org".into(), "settle".into(), "7".into())]
    );
    assert_eq!(
        got(&mut c, "{t}:u"),
        [("{t}:user".into(), "settle".into(), "8".into())]
    );
    // A retried multi-key settle appends nothing.
    ok(&mut c, &settle);
    assert_eq!((xlen(&mut c, "{t}:u"), xlen(&mut c, "{t}:u2")), (1, 1));
    // The replica rebuilt both entries from QUOTA.MAPPLY's LOGGED tokens.
    sync(&mut c);
    let mut r = replica.conn();
    assert_eq!(all_digests(&mut r), all_digests(&mut c));
    for stream in ["{t}:u", "{t}:u2"] {
        assert_eq!(entries(&mut r, stream), entries(&mut c, stream));
    }
}

#[test]
fn charging_expiries_log_what_they_charged() {
    let s = clock_server(&[]);
    let mut c = s.conn();
    let t = |d: i64| (T + d).to_string();
    ok(
        &mut c,
        &[
            "QUOTA.SET",
            "tok",
            "LIMIT",
            "1000",
            "ONEXPIRE",
            "CHARGE",
            "STREAM",
            "u",
            "AT",
            &t(0),
        ],
    );
    ok(
        &mut c,
        &[
            "QUOTA.RESERVE",
            "tok",
            "40",
            "ID",
            "a",
            "TTL",
            "10",
            "AT",
            &t(0),
        ],
    );
    // A later write releases the expired reservation, charging its 40.
    ok(&mut c, &["QUOTA.CHARGE", "tok", "1", "AT", &t(100)]);
    let got: Vec<Fields> = entries(&mut c, "u").into_iter().map(|(_, f)| f).collect();
    assert_eq!(got[0][1].1, "expire");
    assert_eq!((got[0][3].1.as_str(), got[0][4].1.as_str()), ("40", "40"));
    let sum: i64 = got.iter().map(|f| f[4].1.parse::<i64>().unwrap()).sum();
    assert_eq!(sum, info_at(&mut c, "tok", T + 100)["used"]);
}

#[test]
fn writes_that_log_nothing_skip_the_stream_and_the_ones_that_log_are_checked() {
    let s = clock_server(&[]);
    let mut c = s.conn();
    let t = |d: i64| (T + d).to_string();
    ok(
        &mut c,
        &["QUOTA.SET", "b", "LIMIT", "100", "STREAM", "u", "AT", &t(0)],
    );
    // The stream key holds another type (only a user can do that).
    ok(&mut c, &["SET", "u", "x"]);
    // A grant and a heartbeat log nothing: they do not look at the stream key.
    ok(
        &mut c,
        &[
            "QUOTA.RESERVE",
            "b",
            "10",
            "ID",
            "r1",
            "TTL",
            "50",
            "AT",
            &t(1),
        ],
    );
    ok(&mut c, &["QUOTA.EXTEND", "b", "r1", "60", "AT", &t(2)]);
    assert_eq!(info_at(&mut c, "b", T + 2)["reserved"], 10);
    // Every write that would log is refused before anything changes: a settle, a charge, a
    // rollback, and a grant that releases an expired reservation on the way.
    let d = digest(&mut c, "b");
    for cmd in [
        vec!["QUOTA.SETTLE", "b", "r1", "5"],
        vec!["QUOTA.CHARGE", "b", "1"],
        vec!["QUOTA.ROLLBACK", "b", "r1"],
    ] {
        let mut cmd = cmd;
        let now = t(3);
        cmd.extend(["AT", &now]);
        assert_eq!(err(&mut c, &cmd).0, "WRONGTYPE", "{cmd:?}");
    }
    let late = t(100);
    assert_eq!(
        err(
            &mut c,
            &["QUOTA.RESERVE", "b", "1", "ID", "r2", "AT", &late]
        )
        .0,
        "WRONGTYPE"
    );
    assert_eq!(digest(&mut c, "b"), d);
    assert_eq!(text(&ok(&mut c, &["GET", "u"])), "x");
    // With the stream back, the same grant logs the expiry.
    ok(&mut c, &["DEL", "u"]);
    ok(
        &mut c,
        &["QUOTA.RESERVE", "b", "1", "ID", "r2", "AT", &late],
    );
    let got: Vec<Fields> = entries(&mut c, "u").into_iter().map(|(_, f)| f).collect();
    assert_eq!(got, [entry("b", "expire", "r1", 10, 0, 0, -1, T + 100)]);
}

/// Waits until `n` clients are blocked (a blocking read on another connection).
fn wait_blocked(c: &mut redis::Connection, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while info_section(c, "clients")["blocked_clients"] != n {
        assert!(Instant::now() < deadline, "the reader did not block");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A blocking read on its own connection, in a thread: its reply, or the error.
fn blocked_read(s: &Server, args: &[&str]) -> std::thread::JoinHandle<redis::RedisResult<Value>> {
    let mut reader = s.conn();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    std::thread::spawn(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        q(&mut reader, &args)
    })
}

#[test]
fn blocked_readers_and_watchers_see_a_new_entry() {
    let s = clock_server(&[]);
    let mut c = s.conn();
    ok(
        &mut c,
        &[
            "QUOTA.SET",
            "b",
            "LIMIT",
            "100",
            "STREAM",
            "u",
            "AT",
            &at(T),
        ],
    );
    // The exporter's read: XREADGROUP BLOCK on a stream that exists (empty, MKSTREAM).
    ok(&mut c, &["XGROUP", "CREATE", "u", "g", "$", "MKSTREAM"]);
    let group = blocked_read(
        &s,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "c1",
            "BLOCK",
            "20000",
            "STREAMS",
            "u",
            ">",
        ],
    );
    wait_blocked(&mut c, 1);
    ok(&mut c, &["QUOTA.CHARGE", "b", "3", "AT", &at(T + 1)]);
    let reply = group.join().unwrap().unwrap();
    let streams = items(&reply);
    assert_eq!(streams.len(), 1);
    let got = items(&items(&streams[0])[1]);
    assert_eq!(got.len(), 1);
    assert_eq!(text(&items(&got[0])[0]), entries(&mut c, "u")[0].0);
    // A plain XREAD BLOCK, on a stream that exists, then on one the entry creates.
    for stream in ["u", "u2"] {
        if stream == "u2" {
            ok(
                &mut c,
                &["QUOTA.SET", "b", "STREAM", "u2", "AT", &at(T + 2)],
            );
        }
        let plain = blocked_read(&s, &["XREAD", "BLOCK", "20000", "STREAMS", stream, "$"]);
        wait_blocked(&mut c, 1);
        ok(&mut c, &["QUOTA.CHARGE", "b", "1", "AT", &at(T + 3)]);
        let reply = plain.join().unwrap().unwrap();
        let got = items(&items(&items(&reply)[0])[1]);
        assert_eq!(got.len(), 1, "{stream}");
        let fields = items(&items(&got[0])[1]);
        assert_eq!(text(&fields[3]), "charge", "{stream}");
    }
    // WATCH on the stream key sees the entry (as an XADD's change).
    let mut w = s.conn();
    ok(&mut w, &["WATCH", "u2"]);
    ok(&mut c, &["QUOTA.CHARGE", "b", "1", "AT", &at(T + 4)]);
    ok(&mut w, &["MULTI"]);
    ok(&mut w, &["PING"]);
    assert_eq!(ok(&mut w, &["EXEC"]), Value::Nil);
}

#[test]
fn entries_fire_the_keyspace_events_of_an_xadd() {
    // Small nodes, so that MAXLEN ~ 2 trims every few entries.
    let s = clock_server(&["--stream-node-max-entries", "2"]);
    let mut c = s.conn();
    ok(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "Et"]);
    let mut sub = s.conn();
    sub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut ps = sub.as_pubsub();
    ps.psubscribe("__keyevent@0__:x*").unwrap();
    ok(
        &mut c,
        &[
            "QUOTA.SET",
            "b",
            "LIMIT",
            "100",
            "STREAM",
            "u",
            "STREAMMAXLEN",
            "2",
            "AT",
            &at(T),
        ],
    );
    let n = 7;
    for i in 0..n {
        ok(&mut c, &["QUOTA.CHARGE", "b", "1", "AT", &at(T + 1 + i)]);
    }
    // What a client's own XADD MAXLEN ~ 2 fires, for the same number of entries.
    for _ in 0..n {
        ok(&mut c, &["XADD", "v", "MAXLEN", "~", "2", "*", "f", "1"]);
    }
    // Events arrive in order: a last XADD on another key marks the end.
    ok(&mut c, &["XADD", "end", "*", "f", "1"]);
    let mut events: Vec<(String, String)> = Vec::new();
    loop {
        let m = ps.get_message().unwrap();
        let event = m.get_channel_name().trim_start_matches("__keyevent@0__:");
        let key: String = m.get_payload().unwrap();
        if key == "end" {
            break;
        }
        events.push((event.to_string(), key));
    }
    let of = |k: &str| -> Vec<String> {
        events
            .iter()
            .filter(|(_, key)| key == k)
            .map(|(e, _)| e.clone())
            .collect()
    };
    assert_eq!(of("u").iter().filter(|e| *e == "xadd").count(), n as usize);
    assert!(of("u").iter().any(|e| e == "xtrim"), "{:?}", of("u"));
    assert_eq!(of("u"), of("v"));
    assert_eq!(xlen(&mut c, "u"), xlen(&mut c, "v"));
}

#[test]
fn without_xadd_entries_are_still_logged_and_replicated() {
    // XADD renamed away: the entries are added through the stream API and carried to replicas
    // in the effects (`LOGGED`), so no XADD is needed anywhere.
    let args = ["--rename-command", "XADD", ""];
    let master = clock_server(&args);
    let replica = clock_server(&args);
    replica.replicate_from(&master);
    let mut m = master.conn();
    let mut r = replica.conn();
    ok(
        &mut m,
        &[
            "QUOTA.SET",
            "b",
            "LIMIT",
            "100",
            "STREAM",
            "u",
            "AT",
            &at(T),
        ],
    );
    ok(&mut m, &["QUOTA.CHARGE", "b", "3", "AT", &at(T + 1)]);
    ok(&mut m, &["QUOTA.CHARGE", "b", "2", "AT", &at(T + 2)]);
    assert_eq!(xlen(&mut m, "u"), 2);
    let stats = info_section(&mut m, "quota");
    assert_eq!(stats["quota_usage_stream_errors"], 0);
    assert_eq!(info_at(&mut m, "b", T + 2)["used"], 5);
    sync(&mut m);
    assert_eq!(all_digests(&mut r), all_digests(&mut m));
    assert_eq!(entries(&mut r, "u"), entries(&mut m, "u"));
}

/// One command in RESP, as an AOF holds it.
fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// An AOF of both replicated forms: `QUOTA.APPLY` followed by the `XADD` the master replicated
/// (before `LOGGED` existed), and `QUOTA.APPLY` with `LOGGED` (the replay adds the entry with
/// the master's id and trims to its length). Forged `LOGGED` tokens are refused and change
/// nothing; a stream key of another type refuses the line (an error, no crash).
#[test]
fn aofs_of_both_forms_load_and_forged_logged_tokens_are_refused() {
    let t = |d: i64| (T + d).to_string();
    let line = |d: i64, rest: &str| format!("{} {rest}", t(d));
    let config = "CONFIG 100 0 0 -1 60000 NONE 3:UTC - - - USAGE 1:u 10";
    let mut lines: Vec<Vec<String>> = vec![
        vec!["QUOTA.APPLY".into(), "b".into(), line(0, config)],
        // Before LOGGED: the effects, then the XADD.
        vec!["QUOTA.APPLY".into(), "b".into(), line(1, "CHARGE 3 0")],
        [
            "XADD",
            "u",
            "MAXLEN",
            "=",
            "1",
            &format!("{}-0", t(1)),
            "key",
            "b",
            "event",
            "charge",
            "id",
            "",
            "held",
            "-1",
            "charged",
            "3",
            "used",
            "3",
            "period_start",
            "-1",
            "at",
            &t(1),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        // With LOGGED: an entry with the master's id; then one the master trimmed down to.
        vec![
            "QUOTA.APPLY".into(),
            "b".into(),
            line(2, &format!("CHARGE 4 0 LOGGED {} 5 2", t(2))),
        ],
        vec![
            "QUOTA.APPLY".into(),
            "b".into(),
            line(3, &format!("CHARGE 1 0 LOGGED {} 0 1", t(3))),
        ],
    ];
    // Forged: each refused by the decoder before anything applies.
    for forged in [
        format!("LOGGED {} 0 1 CHARGE 1 0", t(4)),
        format!("GRANT 1:a 1 {} LOGGED {} 0 1", t(9999), t(4)),
        format!("CHARGE 1 0 LOGGED {} 0 2 LOGGED {} 1 3", t(4), t(4)),
        "CHARGE 1 0 LOGGED 0 0 2".to_string(),
        format!("CHARGE 1 0 LOGGED {} 0 0", t(4)),
        format!("CHARGE 1 0 LOGGED {} 01 2", t(4)),
        format!("CHARGE 1 0 LOGGED {} -1 2", t(4)),
        format!("CHARGE 1 0 LOGGED {} 0", t(4)),
        format!("CHARGE 1 0 LOGGED x{} 0 2", t(4)),
    ] {
        lines.push(vec!["QUOTA.APPLY".into(), "b".into(), line(4, &forged)]);
    }
    // A budget whose stream key holds a string: its line with an entry is refused.
    let c_config = "CONFIG 100 0 0 -1 60000 NONE 3:UTC - - - USAGE 2:cu 10";
    lines.push(vec!["QUOTA.APPLY".into(), "c".into(), line(0, c_config)]);
    lines.push(vec!["SET".into(), "cu".into(), "x".into()]);
    lines.push(vec![
        "QUOTA.APPLY".into(),
        "c".into(),
        line(1, &format!("CHARGE 1 0 LOGGED {} 0 1", t(1))),
    ]);
    let mut aof = Vec::new();
    for l in &lines {
        let args: Vec<&str> = l.iter().map(String::as_str).collect();
        aof.extend(resp(&args));
    }
    let args = ["--appendonly", "yes", "--aof-use-rdb-preamble", "no"];
    let mods = ["test-clock", "yes", "sweep-effort", "0"];
    let s = Server::start_with_files(&args, &mods, &[("appendonly.aof", &aof)]);
    let mut c = s.conn();
    assert_eq!(keys(&mut c), ["b", "c", "cu", "u"]);
    assert_eq!(info_at(&mut c, "b", T + 4)["used"], 8);
    assert_eq!(info_at(&mut c, "c", T + 4)["used"], 0);
    assert_eq!(text(&ok(&mut c, &["GET", "cu"])), "x");
    // No double entries: the old line's XADD gave the first entry, and the new lines' entries
    // were rebuilt; the last trimmed the stream to the master's length, 1.
    assert_eq!(
        entries(&mut c, "u"),
        [(
            format!("{}-0", t(3)),
            entry("b", "charge", "", -1, 1, 8, -1, T + 3)
        )]
    );
    let meta = stream_meta(&mut c, "u");
    let get = |k: &str| meta.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(get("entries-added").as_deref(), Some("3"));
    assert_eq!(get("last-generated-id"), Some(format!("{}-0", t(3))));
    assert_eq!(
        info_section(&mut c, "quota")["quota_usage_stream_errors"],
        1
    );
}

/// An entry a replay cannot add (the stream already holds a later id: never with identical
/// state) is counted and logged, and the log line names the budget and its stream, escaped
/// for the log (issue 19).
#[test]
fn an_entry_that_cannot_be_added_is_logged_with_its_keys() {
    let t = |d: i64| (T + d).to_string();
    let config = format!(
        "{} CONFIG 100 0 0 -1 60000 NONE 3:UTC - - - USAGE 1:u 10",
        t(0)
    );
    let ahead = format!("{}-0", t(100));
    let charge = format!("{} CHARGE 1 0 LOGGED {} 0 2", t(1), t(1));
    let lines: [Vec<&str>; 3] = [
        vec!["QUOTA.APPLY", "b%x", &config],
        vec!["XADD", "u", &ahead, "f", "v"],
        vec!["QUOTA.APPLY", "b%x", &charge],
    ];
    let aof: Vec<u8> = lines.iter().flat_map(|l| resp(l)).collect();
    let args = ["--appendonly", "yes", "--aof-use-rdb-preamble", "no"];
    let mods = ["test-clock", "yes", "sweep-effort", "0"];
    let s = Server::start_with_files(&args, &mods, &[("appendonly.aof", &aof)]);
    let mut c = s.conn();
    assert_eq!(info_at(&mut c, "b%x", T + 1)["used"], 1);
    assert_eq!(
        info_section(&mut c, "quota")["quota_usage_stream_errors"],
        1
    );
    let log = s.log();
    assert!(
        log.contains("quota: a usage stream entry could not be added (budget 'b%x', stream 'u')"),
        "{log}"
    );
}

/// On a replica the rebuilt entries fire what the master's fire (`xadd`, `xtrim`) and touch
/// `WATCH`; entries made in one MULTI/EXEC (ids in the same millisecond) come out identical.
#[test]
fn replicas_signal_rebuilt_entries_and_multi_exec_keeps_the_ids() {
    let master = clock_server(&["--stream-node-max-entries", "2"]);
    let replica = clock_server(&["--stream-node-max-entries", "2"]);
    replica.replicate_from(&master);
    let mut m = master.conn();
    let mut r = replica.conn();
    ok(&mut r, &["CONFIG", "SET", "notify-keyspace-events", "Et"]);
    let mut sub = replica.conn();
    sub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut ps = sub.as_pubsub();
    ps.psubscribe("__keyevent@0__:x*").unwrap();
    ok(
        &mut m,
        &[
            "QUOTA.SET",
            "b",
            "LIMIT",
            "100",
            "STREAM",
            "u",
            "STREAMMAXLEN",
            "2",
            "AT",
            &at(T),
        ],
    );
    let mut pipe = redis::pipe();
    pipe.atomic();
    for i in 0..5 {
        pipe.cmd("QUOTA.CHARGE")
            .arg("b")
            .arg(1)
            .arg("AT")
            .arg(T + 1 + i);
    }
    let _: Value = pipe.query(&mut m).unwrap();
    sync(&mut m);
    // WATCH on the replica sees the next rebuilt entry.
    let mut w = replica.conn();
    ok(&mut w, &["WATCH", "u"]);
    ok(&mut m, &["QUOTA.CHARGE", "b", "1", "AT", &at(T + 9)]);
    ok(&mut m, &["XADD", "end", "*", "f", "1"]);
    sync(&mut m);
    ok(&mut w, &["MULTI"]);
    ok(&mut w, &["XLEN", "u"]);
    assert_eq!(ok(&mut w, &["EXEC"]), Value::Nil);
    let mut events: Vec<String> = Vec::new();
    loop {
        let msg = ps.get_message().unwrap();
        let event = msg.get_channel_name().trim_start_matches("__keyevent@0__:");
        let key: String = msg.get_payload().unwrap();
        if key == "end" {
            break;
        }
        assert_eq!(key, "u");
        events.push(event.to_string());
    }
    assert_eq!(events.iter().filter(|e| *e == "xadd").count(), 6);
    assert!(events.iter().any(|e| e == "xtrim"), "{events:?}");
    assert_eq!(entries(&mut r, "u"), entries(&mut m, "u"));
    assert_eq!(stream_meta(&mut r, "u"), stream_meta(&mut m, "u"));
    assert_eq!(all_digests(&mut r), all_digests(&mut m));
    assert_eq!(info_at(&mut r, "b", T + 9)["used"], 6);
}
