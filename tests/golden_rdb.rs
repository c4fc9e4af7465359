//! Golden RDB files, one per encoding version, written by earlier builds and committed under
//! tests/fixtures/. A format change that stops old files loading fails here.

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

/// budget-v3.rdb: budget encoding 3 (expiry policy, unit, heartbeats, expiry charges), written
/// by a debug build of issue 22 with `quota.test-clock yes sweep-effort 0`, T = 4102444800000
/// (2100-01-01T00:00Z). Made with:
///
/// ```text
/// QUOTA.SET v3 LIMIT 300 UNIT min PERIOD MONTH ONEXPIRE ELAPSED TTL 300000 AT T
/// QUOTA.RESERVE v3 60 ID s1 AT T
/// QUOTA.EXTEND v3 s1 300000 AT T+240000
/// QUOTA.RESERVE v3 60 ID s2 AT T+1000            # runs at the key's time, T+240000
/// QUOTA.EXTEND v3 s2 300000 AT T+481000
/// QUOTA.EXTEND v3 s1 300000 AT T+500000
/// QUOTA.RESERVE v3 10 ID s3 TTL 600000 AT T+790000  # releases s2: 241 s -> 5 min charged
/// QUOTA.SET tok LIMIT 1000 ONEXPIRE CHARGE UNIT s AT T
/// QUOTA.RESERVE tok 100 ID a TTL 10 AT T
/// QUOTA.CHARGE tok 5 AT T+20                      # releases a: 100 charged
/// SAVE
/// ```
#[test]
fn budget_encoding_v3_loads() {
    let rdb = include_bytes!("fixtures/budget-v3.rdb");
    let s = Server::start_with_files(
        &[],
        &["test-clock", "yes", "sweep-effort", "0"],
        &[("dump.rdb", rdb)],
    );
    let mut c = s.conn();
    assert_eq!(keys(&mut c), ["tok", "v3"]);
    assert_eq!(
        info_fields(&mut c, "v3", &t(790_000)),
        pairs(&[
            ("limit", "300"),
            ("used", "5"),
            ("reserved", "70"),
            ("available", "225"),
            ("overdraft", "0"),
            ("max_reserve", "-1"),
            ("default_ttl_ms", "300000"),
            ("pending", "2"),
            ("overrun", "0"),
            ("period", "MONTH"),
            ("tz", "UTC"),
            ("period_start_ms", "4102444800000"),
            ("period_end_ms", "4105123200000"),
            ("on_expire", "ELAPSED"),
            ("unit", "min"),
            ("stream", ""),
            ("stream_maxlen", "-1"),
        ])
    );
    // Starts and last heartbeats survive (-1: none).
    let p = items(&ok(&mut c, &["QUOTA.PENDING", "v3", "AT", &t(790_000)]));
    let rows: Vec<(String, Vec<i64>)> = p
        .iter()
        .map(|r| {
            let r = items(r);
            (text(&r[0]), r[1..].iter().map(int).collect())
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            (
                "s1".to_string(),
                vec![60, 790_000, 10_000, 4_102_444_800_000, 4_102_445_300_000]
            ),
            (
                "s3".to_string(),
                vec![10, 0, 600_000, 4_102_445_590_000, -1]
            ),
        ]
    );
    // s1 expires at T+800000 and is charged to its last heartbeat: 500 s -> 9 min.
    assert_eq!(info_fields(&mut c, "v3", &t(800_000))[1].1, "14");
    // The expiry charge of s2 (5) is remembered: a late settle replaces it.
    let r = items(&ok(
        &mut c,
        &["QUOTA.SETTLE", "v3", "s2", "2", "AT", &t(790_001)],
    ));
    assert_eq!((text(&r[0]), int(&r[1])), ("late".to_string(), 2));
    assert_eq!(info_fields(&mut c, "v3", &t(790_001))[1].1, "2");
    // The CHARGE policy key: a's 100 were charged at expiry; 30 replaces them.
    assert_eq!(info_fields(&mut c, "tok", &t(20))[1].1, "105");
    let r = items(&ok(
        &mut c,
        &["QUOTA.SETTLE", "tok", "a", "30", "AT", &t(21)],
    ));
    assert_eq!(text(&r[0]), "late");
    assert_eq!(info_fields(&mut c, "tok", &t(21))[1].1, "35");
    assert_eq!(info_fields(&mut c, "tok", &t(21))[14].1, "s");
}

/// T + `d` ms as a command argument, T = 4102444800000 (2100-01-01 UTC), the fixtures' time.
fn t(d: i64) -> String {
    (4_102_444_800_000i64 + d).to_string()
}

/// Runs one command line on `con` and returns its reply (an error reply fails the test): the
/// line split on spaces, `+d` read as [`t`]`(d)` and `\u{1}` as a space inside an argument.
fn run_at_t(con: &mut redis::Connection, line: &str) -> Value {
    let args: Vec<String> = line
        .split(' ')
        .map(|w| match w.strip_prefix('+') {
            Some(d) => t(d.parse().unwrap()),
            None => w.replace('\u{1}', " "),
        })
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok(con, &args)
}

/// Every QUOTA.INFO field, integers and strings alike, in reply order.
fn info_fields(c: &mut redis::Connection, key: &str, at: &str) -> Vec<(String, String)> {
    let v = ok(c, &["QUOTA.INFO", key, "AT", at]);
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

fn pairs(want: &[(&str, &str)]) -> Vec<(String, String)> {
    want.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// budget-v2-window-v1.rdb: budget encoding 2 (with a calendar period) and window encoding 1,
/// written by a debug build at commit 99f0858 with `quota.test-clock yes`. Times are in the
/// year 2100 (T = 4102444800000, 2100-01-01T00:00Z) so the window key's absolute expiry is still
/// in the future when the file loads (an expired key would be skipped). Made with:
///
/// ```text
/// redis-server --port 6391 --dir DIR --save '' --loadmodule libredis_quota.so test-clock yes
/// redis-cli -p 6391 <<EOF
/// QUOTA.SET golden LIMIT 1000 OVERDRAFT 10 MAXRESERVE 500 TTL 60000 PERIOD DAY TZ Europe/Paris AT T
/// QUOTA.RESERVE golden 100 ID a AT T+1
/// QUOTA.RESERVE golden 200 AT T+2                      # id T+2-0
/// QUOTA.RESERVE golden 50 ID b TTL 1000 AT T+3
/// QUOTA.SETTLE golden a 120 AT T+4
/// QUOTA.CHARGE golden 7 ID c1 AT T+5
/// QUOTA.ROLLBACK golden b AT T+6
/// QUOTA.SET monthly LIMIT 5000 PERIOD MONTH TZ America/New_York ANCHOR 4099766400000 AT T
/// QUOTA.CHARGE monthly 40 AT T+10
/// QUOTA.RESERVE monthly 25 ID m1 TTL 3600000 AT T+11
/// QUOTA.WINDOW win 10 60000 COST 3 PRECISION 1000 AT T
/// QUOTA.WINDOW win 10 60000 COST 2 PRECISION 1000 AT T+1500
/// QUOTA.WINDOW win 10 60000 COST 4 PRECISION 1000 AT T+2500
/// SAVE
/// EOF
/// ```
/// (with the numbers written out), then DIR/dump.rdb copied here.
#[test]
fn budget_encoding_v2_and_window_encoding_v1_still_load() {
    let rdb = include_bytes!("fixtures/budget-v2-window-v1.rdb");
    let s = Server::start_with_files(&[], &["test-clock", "yes"], &[("dump.rdb", rdb)]);
    let mut c = s.conn();
    assert_eq!(keys(&mut c), ["golden", "monthly", "win"]);

    // The budget with a daily period in Paris (2100-01-01 01:00 local is in the day that
    // started 2099-12-31T23:00Z).
    assert_eq!(
        info_fields(&mut c, "golden", &t(6)),
        pairs(&[
            ("limit", "1000"),
            ("used", "127"),
            ("reserved", "200"),
            ("available", "673"),
            ("overdraft", "10"),
            ("max_reserve", "500"),
            ("default_ttl_ms", "60000"),
            ("pending", "1"),
            ("overrun", "20"),
            ("period", "DAY"),
            ("tz", "Europe/Paris"),
            ("period_start_ms", "4102441200000"),
            ("period_end_ms", "4102527600000"),
            ("on_expire", "RELEASE"),
            ("unit", "none"),
            ("stream", ""),
            ("stream_maxlen", "-1"),
        ])
    );
    let p = items(&ok(&mut c, &["QUOTA.PENDING", "golden", "AT", &t(6)]));
    assert_eq!(p.len(), 1);
    let e = items(&p[0]);
    assert_eq!(
        (text(&e[0]), int(&e[1]), int(&e[2]), int(&e[3])),
        ("4102444800002-0".into(), 200, 4, 59996)
    );
    // The next local midnight: used and overrun start again; the 60 s reservation has expired.
    assert_eq!(
        info_fields(&mut c, "golden", "4102527600000")[..9],
        pairs(&[
            ("limit", "1000"),
            ("used", "0"),
            ("reserved", "0"),
            ("available", "1000"),
            ("overdraft", "10"),
            ("max_reserve", "500"),
            ("default_ttl_ms", "60000"),
            ("pending", "0"),
            ("overrun", "0"),
        ])[..]
    );
    // Remembered ids, their outcomes and the id generator survive.
    let r = items(&ok(
        &mut c,
        &["QUOTA.SETTLE", "golden", "a", "120", "AT", &t(6)],
    ));
    assert_eq!((text(&r[0]), int(&r[1])), ("duplicate".into(), 120));
    assert_eq!(
        err(&mut c, &["QUOTA.SETTLE", "golden", "b", "1", "AT", &t(6)]).0,
        "CONFLICT"
    );
    let r = items(&ok(
        &mut c,
        &["QUOTA.CHARGE", "golden", "7", "ID", "c1", "AT", &t(6)],
    ));
    assert_eq!(int(&r[0]), 1);
    // A clock behind the key's runs at the key's time (its last write, T+6).
    let r = items(&ok(&mut c, &["QUOTA.RESERVE", "golden", "1", "AT", &t(1)]));
    assert_eq!(text(&r[1]), "4102444800006-0");

    // The anchored monthly budget in New York: periods start on the 30th at 19:00 local.
    assert_eq!(
        info_fields(&mut c, "monthly", &t(11)),
        pairs(&[
            ("limit", "5000"),
            ("used", "40"),
            ("reserved", "25"),
            ("available", "4935"),
            ("overdraft", "0"),
            ("max_reserve", "-1"),
            ("default_ttl_ms", "3600000"),
            ("pending", "1"),
            ("overrun", "0"),
            ("period", "MONTH"),
            ("tz", "America/New_York"),
            ("period_start_ms", "4102358400000"),
            ("period_end_ms", "4105036800000"),
            ("on_expire", "RELEASE"),
            ("unit", "none"),
            ("stream", ""),
            ("stream_maxlen", "-1"),
        ])
    );
    let p = items(&ok(&mut c, &["QUOTA.PENDING", "monthly", "AT", &t(11)]));
    let e = items(&p[0]);
    assert_eq!(
        (text(&e[0]), int(&e[1]), int(&e[2]), int(&e[3])),
        ("m1".into(), 25, 0, 3_600_000)
    );

    // The window: buckets of 3 (T), 2 (T+1.5 s) and 4 (T+2.5 s) in a 60 s window, and the key's
    // absolute expiry when its newest bucket leaves the window.
    assert_eq!(int(&ok(&mut c, &["PEXPIRETIME", "win"])), 4_102_444_862_999);
    let peek = |c: &mut redis::Connection, cost: &str, at: &str| -> Vec<i64> {
        let line = format!("QUOTA.WINDOW win 10 60000 COST {cost} PRECISION 1000 PEEK AT {at}");
        items(&run_at_t(c, &line)).iter().map(int).collect()
    };
    // 9 counted: 1 more fits; everything has left at T+62999.
    assert_eq!(peek(&mut c, "1", &t(2500)), [1, 1, 0, 60499]);
    // 2 more do not fit until the first bucket (3) leaves at T+60999.
    assert_eq!(peek(&mut c, "2", &t(2500)), [0, 1, 58499, 60499]);
    // At T+61000 only the buckets of 2 and 4 are counted.
    assert_eq!(peek(&mut c, "2", &t(61000)), [1, 4, 0, 1999]);
    // PEEK wrote nothing; a counting call records on top of the loaded buckets.
    let v = run_at_t(
        &mut c,
        "QUOTA.WINDOW win 10 60000 COST 1 PRECISION 1000 AT +3000",
    );
    assert_eq!(
        items(&v).iter().map(int).collect::<Vec<_>>(),
        [1, 0, 0, 60999]
    );
}

/// The commands behind `fixtures/window-v2.rdb`, at T = 4102444800000 (2100-01-01 UTC): a
/// budget and two configured windows (TPM, RPM) holding two multi-key reservations (one
/// settled), and a plain window key.
fn window_v2_commands() -> &'static [&'static str] {
    &[
        "QUOTA.SET b LIMIT 1000 AT +0",
        "QUOTA.SET tpm WINDOW 5000 60000 PRECISION 1000 AT +0",
        "QUOTA.SET rpm WINDOW 10 60000 AT +0",
        "QUOTA.MRESERVE 3 b tpm rpm 300 300 1 ID r1 AT +1",
        "QUOTA.MRESERVE 3 b tpm rpm 200 200 1 ID r2 AT +1500",
        "QUOTA.MSETTLE 3 b tpm rpm r1 120 120 1 AT +2000",
        "QUOTA.WINDOW tpm COST 7 AT +2500",
        "QUOTA.WINDOW plain 10 60000 COST 3 AT +0",
    ]
}

/// window-v2.rdb: window encoding 2 (a stored configuration and remembered ids), written by a
/// debug build of the commit that added it, with `quota.test-clock yes`, from [`window_v2_commands`],
/// then `SAVE` (redis-server --dir DIR --save '' --loadmodule libredis_quota.so test-clock yes;
/// DIR/dump.rdb copied here). Loads to exactly the state the same commands reach now, and the
/// ids still settle.
#[test]
fn window_encoding_v2_loads_with_its_configuration_and_ids() {
    let rdb = include_bytes!("fixtures/window-v2.rdb");
    let s = Server::start_with_files(&[], &["test-clock", "yes"], &[("dump.rdb", rdb)]);
    let mut c = s.conn();
    assert_eq!(keys(&mut c), ["b", "plain", "rpm", "tpm"]);
    // The same commands on an empty server reach the same bytes.
    let fresh = Server::start_with_module_args(&[], &["test-clock", "yes"]);
    let mut f = fresh.conn();
    for line in window_v2_commands() {
        run_at_t(&mut f, line);
    }
    assert_eq!(all_digests(&mut c), all_digests(&mut f));
    // And each window key saves again to the very bytes of the file (the in-memory layout of
    // the remembered ids is not the encoding): a DUMP payload is the type byte, the value as the
    // RDB holds it, then 2 bytes of RDB version and 8 of CRC.
    for k in ["b", "plain", "rpm", "tpm"] {
        let dump = |con: &mut redis::Connection| -> Vec<u8> {
            redis::cmd("DUMP").arg(k).query(con).unwrap()
        };
        let loaded = dump(&mut c);
        assert_eq!(loaded, dump(&mut f), "{k}");
        if k == "b" {
            continue; // budgets are written at a newer encoding since
        }
        let value = &loaded[1..loaded.len() - 10];
        assert!(
            rdb.windows(value.len()).any(|w| w == value),
            "{k}: its value re-saved is not the fixture's bytes"
        );
    }
    assert_eq!(
        info_fields(&mut c, "tpm", &t(2500)),
        pairs(&[
            ("limit", "5000"),
            ("window_ms", "60000"),
            ("precision_ms", "1000"),
            ("counted", "327"),
            ("remaining", "4673"),
            ("reset_after_ms", "60499"),
            ("remembered_ids", "2"),
        ])
    );
    // Configured keys have no expiry; the plain window key keeps its own.
    assert_eq!(int(&ok(&mut c, &["PTTL", "tpm"])), -1);
    assert_eq!(int(&ok(&mut c, &["PTTL", "rpm"])), -1);
    assert_eq!(
        int(&ok(&mut c, &["PEXPIRETIME", "plain"])),
        4_102_444_860_999
    );
    // r1 is settled everywhere (a duplicate), r2 still pending: corrected in its bucket.
    let r = items(&run_at_t(
        &mut c,
        "QUOTA.MSETTLE 3 b tpm rpm r1 120 120 1 AT +3000",
    ));
    assert!(r.iter().all(|v| text(&items(v)[0]) == "duplicate"));
    let r = items(&run_at_t(
        &mut c,
        "QUOTA.MSETTLE 3 b tpm rpm r2 50 50 1 AT +3000",
    ));
    let rows: Vec<(String, i64, i64)> = r
        .iter()
        .map(|v| {
            let v = items(v);
            (text(&v[0]), int(&v[1]), int(&v[2]))
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("settled".to_string(), 50, 830),
            ("corrected".to_string(), 50, 4823),
            ("corrected".to_string(), 1, 8),
        ]
    );
}

/// The commands behind `fixtures/effects-v1.aof`, at T = 4102444800000 (2100-01-01 UTC).
fn legacy_aof_commands() -> &'static [&'static str] {
    &[
        "QUOTA.SET golden LIMIT 1000 OVERDRAFT 10 TTL 60000 PERIOD DAY TZ Europe/Paris AT +0",
        "QUOTA.RESERVE golden 100 ID a AT +1",
        "QUOTA.RESERVE golden 200 AT +2",
        "QUOTA.RESERVE golden 50 ID b\u{1}c:d TTL 1000 AT +3",
        "QUOTA.SETTLE golden a 120 AT +4",
        "QUOTA.CHARGE golden 7 ID c1 AT +5",
        "QUOTA.ROLLBACK golden b\u{1}c:d AT +6",
        "QUOTA.WINDOW win 10 60000 COST 3 PRECISION 1000 AT +0",
        "QUOTA.WINDOW win 10 60000 COST 2 PRECISION 1000 AT +1500",
    ]
}

/// effects-v1.aof: the incremental AOF that the build before the packed effect form (commit
/// af89cd0) wrote for [`legacy_aof_commands`] — multi-argument `QUOTA.APPLY key at_ms EFFECT
/// ...` and six-argument `QUOTA.WAPPLY` — loaded as an old-style `appendonly.aof`. The state
/// must be exactly what this build reaches by running the same commands (which it replicates
/// in the packed form).
#[test]
fn multi_argument_effects_of_earlier_versions_still_load() {
    let aof = include_bytes!("fixtures/effects-v1.aof");
    let args = ["--appendonly", "yes", "--aof-use-rdb-preamble", "no"];
    let mods = ["test-clock", "yes", "sweep-effort", "0"];
    let old = Server::start_with_files(&args, &mods, &[("appendonly.aof", aof)]);
    let fresh = Server::start_with_module_args(&[], &mods);
    let (mut o, mut f) = (old.conn(), fresh.conn());
    for line in legacy_aof_commands() {
        run_at_t(&mut f, line);
    }
    assert_eq!(keys(&mut o), ["golden", "win"]);
    assert_eq!(all_digests(&mut o), all_digests(&mut f));
    assert_eq!(
        info_fields(&mut o, "golden", &t(6))[..9],
        pairs(&[
            ("limit", "1000"),
            ("used", "127"),
            ("reserved", "200"),
            ("available", "673"),
            ("overdraft", "10"),
            ("max_reserve", "-1"),
            ("default_ttl_ms", "60000"),
            ("pending", "1"),
            ("overrun", "20"),
        ])[..]
    );
    let w = ok(
        &mut o,
        &["QUOTA.WINDOW", "win", "10", "60000", "PEEK", "AT", &t(2000)],
    );
    assert_eq!(
        items(&w).iter().map(int).collect::<Vec<_>>(),
        [1, 5, 0, 59999]
    );
}

/// The commands behind `fixtures/mapply-v1.aof`, at T = 4102444800000 (2100-01-01 UTC): two
/// budgets of different default TTLs and two configured windows, three multi-key reservations
/// (a client id, a generated one, keys in another order with a TTL), then a settle, a rollback
/// and an extend of them.
fn mapply_v1_commands() -> &'static [&'static str] {
    &[
        "QUOTA.SET b LIMIT 1000 TTL 60000 AT +0",
        "QUOTA.SET b2 LIMIT 500 AT +0",
        "QUOTA.SET tpm WINDOW 5000 60000 PRECISION 1000 AT +0",
        "QUOTA.SET rpm WINDOW 10 60000 AT +0",
        "QUOTA.MRESERVE 4 b tpm rpm b2 300 300 1 30 ID r1 AT +1",
        "QUOTA.MRESERVE 4 b tpm rpm b2 200 200 1 20 AT +1500",
        "QUOTA.MRESERVE 3 rpm b tpm 1 50 50 ID r\u{1}3:x TTL 5000 AT +1600",
        "QUOTA.MSETTLE 4 b tpm rpm b2 r1 120 120 1 10 AT +2000",
        "QUOTA.MROLLBACK 3 rpm b tpm r\u{1}3:x AT +2100",
        "QUOTA.MEXTEND 2 b b2 4102444801500-0 90000 AT +2200",
    ]
}

/// mapply-v1.aof: the incremental AOF that the build before the compact `QUOTA.MAPPLY` form
/// (commit cd93a3c) wrote for [`mapply_v1_commands`] — every multi-key write one `QUOTA.MAPPLY`
/// whose packed string holds each key's full line (`B <len>:<at_ms GRANT ...>`, `W ...`) —
/// loaded as an old-style `appendonly.aof`. It must reach exactly the state this build reaches
/// with the same commands, which this build writes with the reservations in the compact form
/// (`R at_ms id D amount deadline ...`); replaying that AOF reaches it too.
#[test]
fn mapply_lines_of_the_full_form_still_load() {
    let aof = include_bytes!("fixtures/mapply-v1.aof");
    let args = PLAIN_AOF;
    let mods = ["test-clock", "yes", "sweep-effort", "0"];
    let old = Server::start_with_files(&args, &mods, &[("appendonly.aof", aof)]);
    let mut fresh = Server::start_with_module_args(&args, &mods);
    let (mut o, mut f) = (old.conn(), fresh.conn());
    for line in mapply_v1_commands() {
        run_at_t(&mut f, line);
    }
    assert_eq!(keys(&mut o), ["b", "b2", "rpm", "tpm"]);
    let state = all_digests(&mut f);
    assert_eq!(all_digests(&mut o), state);
    // The fixture has no compact line; this build wrote one per reservation (b2's default TTL
    // differs from b's: its grant carries its own deadline).
    assert!(!String::from_utf8_lossy(aof).contains("R 4102444800001"));
    let written = String::from_utf8_lossy(&incr_aof(&fresh)).into_owned();
    for compact in [
        "R 4102444800001 2:r1 D 300 4102444860001 W 60000 1000 300 W 60000 1000 1 D 30 4102448400001",
        "R 4102444801500 15:4102444801500-0 D 200 4102444861500 W 60000 1000 200 W 60000 1000 1 D 20 4102448401500",
        "R 4102444801600 5:r 3:x W 60000 1000 1 D 50 4102444806600 W 60000 1000 50",
    ] {
        assert!(written.contains(&format!("\r\n{compact}\r\n")), "{compact} in {written}");
    }
    assert_eq!(written.matches("QUOTA.MAPPLY").count(), 6);
    fresh.restart();
    assert_eq!(
        all_digests(&mut fresh.conn()),
        state,
        "compact lines replayed"
    );
    // The loaded reservations act as made here: the generated one settles on both budgets.
    let id = format!("{}-0", t(1500));
    let settle = [
        "QUOTA.MSETTLE",
        "4",
        "b",
        "tpm",
        "rpm",
        "b2",
        &id,
        "150",
        "150",
        "1",
        "15",
        "AT",
        &t(2300),
    ];
    let (a, b) = (ok(&mut o, &settle), ok(&mut fresh.conn(), &settle));
    assert_eq!(a, b);
    let statuses: Vec<String> = items(&a).iter().map(|v| text(&items(v)[0])).collect();
    assert_eq!(statuses, ["settled", "corrected", "corrected", "settled"]);
    assert_eq!(all_digests(&mut o), all_digests(&mut fresh.conn()));
}

/// Forged AOF lines a master never writes are refused and change nothing: an effect with an
/// empty or over-long id, a window call at a time outside the supported range. The valid lines
/// around them load.
#[test]
fn forged_effects_in_an_aof_are_refused() {
    let resp = |args: &[&[u8]]| {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        out
    };
    let long = format!(
        "1893456000000 GRANT 70000:{} 1 1893456060000",
        "x".repeat(70_000)
    );
    let mut aof = Vec::new();
    for line in [
        &[
            &b"QUOTA.APPLY"[..],
            b"k",
            b"1893456000000 CONFIG 10 0 0 -1 60000 NONE 3:UTC - - -",
        ][..],
        &[b"QUOTA.APPLY", b"k", b"1893456000000 CHARGEID 1 0 0:"],
        &[b"QUOTA.APPLY", b"k", long.as_bytes()],
        &[
            b"QUOTA.APPLY",
            b"k",
            b"1893456000000 GRANT 1:a 2 1893456060000",
        ],
        &[
            b"QUOTA.WAPPLY",
            b"w",
            b"9223372036854775807 1000 100 1 4102444800000",
        ],
        &[b"QUOTA.WAPPLY", b"w", b"-5 1000 100 1 4102444800000"],
    ] {
        aof.extend(resp(line));
    }
    let args = ["--appendonly", "yes", "--aof-use-rdb-preamble", "no"];
    let mods = ["test-clock", "yes", "sweep-effort", "0"];
    let s = Server::start_with_files(&args, &mods, &[("appendonly.aof", &aof)]);
    let mut c = s.conn();
    assert_eq!(keys(&mut c), ["k"]);
    let i = info(&mut c, "k");
    assert_eq!((i["used"], i["reserved"], i["pending"]), (0, 2, 1));
}

/// budget-v4.rdb: budget encoding 4 (the usage log: stream key and MAXLEN), with the stream
/// it logged to, written by a debug build of branch `usage` merged with main at 53b1edc
/// (encoding 3 being issue 22's) with `quota.test-clock yes` (T = 4102444800000):
///
/// ```text
/// QUOTA.SET {g}:b LIMIT 1000 USED 3 PERIOD DAY TZ Europe/Paris STREAM {g}:usage STREAMMAXLEN 500 AT T
/// QUOTA.RESERVE {g}:b 100 ID a AT T+1
/// QUOTA.SETTLE {g}:b a 120 AT T+2
/// QUOTA.RESERVE {g}:b 50 ID b TTL 600000 AT T+3
/// QUOTA.CHARGE {g}:b 7 ID c1 FORCE AT T+4
/// QUOTA.SET plain LIMIT 10 AT T
/// SAVE
/// ```
#[test]
fn budget_encoding_v4_with_a_usage_log_still_loads() {
    let rdb = include_bytes!("fixtures/budget-v4.rdb");
    let s = Server::start_with_files(
        &[],
        &["test-clock", "yes", "sweep-effort", "0"],
        &[("dump.rdb", rdb)],
    );
    let mut c = s.conn();
    assert_eq!(keys(&mut c), ["plain", "{g}:b", "{g}:usage"]);
    let fields = info_fields(&mut c, "{g}:b", &t(5));
    assert_eq!(
        fields[1..3],
        pairs(&[("used", "130"), ("reserved", "50")])[..]
    );
    assert_eq!(
        fields[15..],
        pairs(&[("stream", "{g}:usage"), ("stream_maxlen", "500")])[..]
    );
    assert_eq!(
        info_fields(&mut c, "plain", &t(5))[15..],
        pairs(&[("stream", ""), ("stream_maxlen", "-1")])[..]
    );
    assert_eq!(int(&ok(&mut c, &["XLEN", "{g}:usage"])), 3);
    // The loaded budget still logs: the settle of b appends the fourth entry.
    ok(&mut c, &["QUOTA.SETTLE", "{g}:b", "b", "40", "AT", &t(6)]);
    let last = items(&ok(
        &mut c,
        &["XREVRANGE", "{g}:usage", "+", "-", "COUNT", "1"],
    ));
    let kv: Vec<String> = items(&items(&last[0])[1]).iter().map(text).collect();
    assert_eq!(
        kv,
        [
            "key",
            "{g}:b",
            "event",
            "settle",
            "id",
            "b",
            "held",
            "50",
            "charged",
            "40",
            "used",
            "170",
            "period_start",
            "4102441200000",
            "at",
            &t(6)
        ]
    );
}
