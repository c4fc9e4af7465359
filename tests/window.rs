//! Integration: QUOTA.WINDOW (sliding-window rate limit, `rq-window` keys) through redis-rs.
//! Time is driven exactly with `AT` (quota.test-clock yes) from `T0`, a time far in the future
//! so that the absolute key expiries set from it never fire while a test runs.

mod common;
use common::*;
use std::time::Duration;

/// 2096-10-02, divisible by every precision used here.
const T0: i64 = 4_000_000_000_000;

fn clock_server() -> Server {
    Server::start_with_module_args(&[], &["test-clock", "yes"])
}

/// `QUOTA.WINDOW args...` → `[allowed, remaining, retry_after_ms, reset_after_ms]`.
fn win(c: &mut redis::Connection, args: &[&str]) -> [i64; 4] {
    let mut full = vec!["QUOTA.WINDOW"];
    full.extend_from_slice(args);
    let r = items(&ok(c, &full));
    assert_eq!(r.len(), 4, "{args:?}");
    [int(&r[0]), int(&r[1]), int(&r[2]), int(&r[3])]
}

/// `QUOTA.WINDOW key limit window_ms [extra...] AT t`.
fn win_at(
    c: &mut redis::Connection,
    key: &str,
    limit: i64,
    window: i64,
    extra: &[&str],
    t: i64,
) -> [i64; 4] {
    let (l, w, at) = (limit.to_string(), window.to_string(), t.to_string());
    let mut args = vec![key, &l, &w];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["AT", &at]);
    win(c, &args)
}

fn pexpiretime(c: &mut redis::Connection, key: &str) -> i64 {
    int(&ok(c, &["PEXPIRETIME", key]))
}

fn exists(c: &mut redis::Connection, key: &str) -> bool {
    int(&ok(c, &["EXISTS", key])) == 1
}

fn memory_usage(c: &mut redis::Connection, key: &str) -> i64 {
    int(&ok(c, &["MEMORY", "USAGE", key]))
}

// ---------------------------------------------------------------- replies at the edges

#[test]
fn replies_at_the_limit_cost_zero_and_cost_above_limit() {
    let s = clock_server();
    let mut c = s.conn();
    let p1 = ["PRECISION", "1"];
    // limit 3 over an exact 1000 ms log.
    assert_eq!(win_at(&mut c, "k", 3, 1000, &p1, T0), [1, 2, 0, 1000]);
    assert_eq!(
        win_at(
            &mut c,
            "k",
            3,
            1000,
            &["PRECISION", "1", "COST", "2"],
            T0 + 1
        ),
        [1, 0, 0, 1000]
    );
    // Exactly at the limit: the next unit waits for the event at T0 to leave (T0 + 1000).
    assert_eq!(win_at(&mut c, "k", 3, 1000, &p1, T0 + 2), [0, 0, 998, 999]);
    // COST 0 fits while counted <= limit, and records nothing.
    assert_eq!(
        win_at(
            &mut c,
            "k",
            3,
            1000,
            &["PRECISION", "1", "COST", "0"],
            T0 + 2
        ),
        [1, 0, 0, 999]
    );
    // COST above the limit never fits: retry -1.
    assert_eq!(
        win_at(
            &mut c,
            "k",
            3,
            1000,
            &["PRECISION", "1", "COST", "4"],
            T0 + 2
        ),
        [0, 0, -1, 999]
    );
    // One ms before the boundary, still denied; at it, admitted.
    assert_eq!(win_at(&mut c, "k", 3, 1000, &p1, T0 + 999), [0, 0, 1, 2]);
    assert_eq!(
        win_at(&mut c, "k", 3, 1000, &p1, T0 + 1000),
        [1, 0, 0, 1000]
    );
    // A lowered limit: COST 0 fails until counted <= limit (the 2 at T0+1 leave at T0+1001).
    assert_eq!(
        win_at(
            &mut c,
            "k",
            1,
            1000,
            &["PRECISION", "1", "COST", "0", "PEEK"],
            T0 + 1000
        ),
        [0, 0, 1, 1000]
    );

    // On a missing key: COST 0 and COST > limit answer without creating it.
    assert_eq!(
        win_at(&mut c, "m", 5, 1000, &["COST", "0"], T0),
        [1, 5, 0, 0]
    );
    assert_eq!(
        win_at(&mut c, "m", 5, 1000, &["COST", "6"], T0),
        [0, 5, -1, 0]
    );
    assert_eq!(win_at(&mut c, "m", 0, 1000, &[], T0), [0, 0, -1, 0]);
    assert_eq!(
        win_at(&mut c, "m", 0, 1000, &["COST", "0"], T0),
        [1, 0, 0, 0]
    );
    assert!(!exists(&mut c, "m"));
    // COST equal to the limit fits in one call.
    assert_eq!(
        win_at(&mut c, "m", 5, 1000, &["COST", "5", "PRECISION", "1"], T0),
        [1, 0, 0, 1000]
    );
    assert!(exists(&mut c, "m"));
}

#[test]
fn whole_buckets_window_boundary_and_time_jumps() {
    let s = clock_server();
    let mut c = s.conn();
    let p = ["PRECISION", "1000"];
    // An event at T0+999 is in bucket [T0, T0+999] and leaves a 3000 ms window at T0+3999.
    assert_eq!(win_at(&mut c, "b", 1, 3000, &p, T0 + 999), [1, 0, 0, 3000]);
    assert_eq!(
        win_at(&mut c, "b", 1, 3000, &p, T0 + 1000),
        [0, 0, 2999, 2999]
    );
    assert_eq!(
        win_at(
            &mut c,
            "b",
            1,
            3000,
            &["PRECISION", "1000", "PEEK"],
            T0 + 3998
        ),
        [0, 0, 1, 1]
    );
    assert_eq!(win_at(&mut c, "b", 1, 3000, &p, T0 + 3999), [1, 0, 0, 3000]);
    // Whole buckets are conservative: an event at T0 counts as if at T0+999.
    assert_eq!(win_at(&mut c, "e", 1, 3000, &p, T0), [1, 0, 0, 3999]);
    assert_eq!(
        win_at(&mut c, "e", 1, 3000, &p, T0 + 3000),
        [0, 0, 999, 999]
    );

    // Default precision: window / 60 = 16 ms buckets.
    assert_eq!(win_at(&mut c, "j", 2, 1000, &[], T0), [1, 1, 0, 1015]);
    assert_eq!(win_at(&mut c, "j", 2, 1000, &[], T0), [1, 0, 0, 1015]);
    assert_eq!(win_at(&mut c, "j", 2, 1000, &[], T0), [0, 0, 1015, 1015]);
    // A jump far beyond the window: everything has left.
    let far = T0 + 1_000_000;
    assert_eq!(win_at(&mut c, "j", 2, 1000, &[], far), [1, 1, 0, 1015]);
    assert_eq!(pexpiretime(&mut c, "j"), far + 15 + 1000);
    // A lagging clock counts as the key's latest time; durations are from the caller's time.
    assert_eq!(
        win_at(&mut c, "j", 2, 1000, &[], T0 + 500),
        [1, 0, 0, 1_000_515]
    );
    assert_eq!(pexpiretime(&mut c, "j"), far + 15 + 1000);
    assert_eq!(
        win_at(&mut c, "j", 2, 1000, &["PEEK"], T0 + 500),
        [0, 0, 1_000_515, 1_000_515]
    );
}

#[test]
fn retry_after_is_honoured_exactly() {
    let s = clock_server();
    let mut c = s.conn();
    let mut t = T0;
    let mut denials = 0;
    for i in 0..300i64 {
        let cost = (1 + i % 3).to_string();
        let extra = ["PRECISION", "100", "COST", cost.as_str()];
        let r = win_at(&mut c, "r", 10, 5000, &extra, t);
        if r[0] == 1 {
            t += (i * 37) % 300;
            continue;
        }
        denials += 1;
        let retry = r[2];
        assert!(retry > 0, "{r:?} at {t}");
        let peek = ["PRECISION", "100", "COST", cost.as_str(), "PEEK"];
        assert_eq!(
            win_at(&mut c, "r", 10, 5000, &peek, t + retry - 1)[0],
            0,
            "just before"
        );
        t += retry;
        assert_eq!(
            win_at(&mut c, "r", 10, 5000, &extra, t)[0],
            1,
            "at retry_after"
        );
    }
    assert!(denials > 20, "the workload must hit the limit ({denials})");
}

// ---------------------------------------------------------------- key expiry

#[test]
fn key_expiry_is_absolute_at_empty_time_and_moves() {
    let s = clock_server();
    let mut c = s.conn();
    let p = ["PRECISION", "1000"];
    win_at(&mut c, "k", 2, 60_000, &p, T0);
    assert_eq!(pexpiretime(&mut c, "k"), T0 + 999 + 60_000);
    win_at(&mut c, "k", 2, 60_000, &p, T0 + 5500);
    assert_eq!(pexpiretime(&mut c, "k"), T0 + 5999 + 60_000);
    // Denied and PEEK calls leave it.
    assert_eq!(win_at(&mut c, "k", 2, 60_000, &p, T0 + 7000)[0], 0);
    win_at(
        &mut c,
        "k",
        2,
        60_000,
        &["PRECISION", "1000", "PEEK"],
        T0 + 7000,
    );
    assert_eq!(pexpiretime(&mut c, "k"), T0 + 5999 + 60_000);
    // A shorter window keeps the 60 s history (horizon): expiry still 60 s after the newest.
    win_at(&mut c, "k", 100, 10_000, &p, T0 + 8000);
    assert_eq!(pexpiretime(&mut c, "k"), T0 + 8999 + 60_000);
    // 1 ms precision caps the horizon at 4096 ms: the expiry moves earlier.
    win_at(&mut c, "k", 100, 1000, &["PRECISION", "1"], T0 + 9000);
    assert_eq!(pexpiretime(&mut c, "k"), T0 + 9000 + 4096);

    // A user's PERSIST lasts while counting calls land in the same newest bucket (the expiry
    // they would set is the one already set, so they skip the write), and is overridden by the
    // first counting call that moves the empty time.
    win_at(&mut c, "k", 100, 1000, &["PRECISION", "1000"], T0 + 9000);
    let due = pexpiretime(&mut c, "k");
    ok(&mut c, &["PERSIST", "k"]);
    win_at(&mut c, "k", 100, 1000, &["PRECISION", "1000"], T0 + 9500);
    assert_eq!(pexpiretime(&mut c, "k"), -1);
    win_at(&mut c, "k", 100, 1000, &["PRECISION", "1000"], T0 + 10_000);
    assert_eq!(pexpiretime(&mut c, "k"), due + 1000);

    // On the wall clock the key really expires once empty.
    assert_eq!(win(&mut c, &["real", "10", "200", "PRECISION", "10"])[0], 1);
    let pttl = int(&ok(&mut c, &["PTTL", "real"]));
    assert!((1..=210).contains(&pttl), "PTTL {pttl}");
    std::thread::sleep(Duration::from_millis(400));
    assert!(!exists(&mut c, "real"));
}

#[test]
fn a_cost_zero_call_that_empties_the_window_deletes_the_key() {
    let s = clock_server();
    let mut c = s.conn();
    win_at(&mut c, "k", 5, 60_000, &["PRECISION", "1000"], T0);
    // Finer precision shrinks the horizon to 4096 ms: at T0+10000 nothing is held any more.
    assert_eq!(
        win_at(
            &mut c,
            "k",
            5,
            1000,
            &["PRECISION", "1", "COST", "0"],
            T0 + 10_000
        ),
        [1, 5, 0, 0]
    );
    assert!(!exists(&mut c, "k"));
}

// ---------------------------------------------------------------- types and errors

#[test]
fn wrongtype_both_ways() {
    let s = clock_server();
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "budget", "LIMIT", "10"]);
    ok(&mut c, &["SET", "plain", "x"]);
    win(&mut c, &["window", "10", "1000"]);
    assert_eq!(
        ok(&mut c, &["TYPE", "window"]),
        Value::SimpleString("rq-window".into())
    );
    for args in [
        vec!["QUOTA.WINDOW", "budget", "10", "1000"],
        vec!["QUOTA.WINDOW", "budget", "10", "1000", "PEEK"],
        vec!["QUOTA.WINDOW", "plain", "10", "1000"],
        vec!["QUOTA.RESERVE", "window", "1"],
        vec!["QUOTA.CHARGE", "window", "1"],
        vec!["QUOTA.SET", "window", "LIMIT", "5"],
        vec!["GET", "window"],
    ] {
        assert_eq!(err(&mut c, &args).0, "WRONGTYPE", "{args:?}");
    }
    assert_eq!(info(&mut c, "budget")["limit"], 10);
    // QUOTA.INFO reads window keys too (issue 19); a string is still WRONGTYPE.
    assert_eq!(info(&mut c, "window")["window_ms"], 1000);
    assert_eq!(err(&mut c, &["QUOTA.INFO", "plain"]).0, "WRONGTYPE");
}

#[test]
fn bad_arguments_are_refused_and_write_nothing() {
    let s = clock_server();
    let mut c = s.conn();
    let cases: &[(&[&str], &str)] = &[
        (&[], "wrong number of arguments"),
        (
            &["k", "10"],
            "wrong number of arguments for 'QUOTA.WINDOW' command. Usage: QUOTA.WINDOW key",
        ),
        (
            &["k", "ten", "1000"],
            "limit is not an integer or out of range: got 'ten'. Usage: QUOTA.WINDOW key \
             [limit window_ms] [COST cost] [PRECISION precision_ms] [PEEK] [AT unix_ms]",
        ),
        (&["k", "10", "1s"], "not an integer"),
        (
            &["k", "10", "1000", "COST", "1.5"],
            "value of COST is not an integer or out of range: got '1.5'",
        ),
        (&["k", "10", "1000", "PRECISION", "x"], "not an integer"),
        (&["k", "10", "1000", "AT", "soon"], "not an integer"),
        (&["k", "10", "99999999999999999999"], "not an integer"),
        (&["k", "-1", "1000"], "limit must not be negative"),
        (&["k", "10", "0"], "window_ms must be positive"),
        (&["k", "10", "-5"], "window_ms must be positive"),
        (
            &["k", "10", "1000", "COST", "-1"],
            "COST must not be negative",
        ),
        (
            &["k", "10", "1000", "PRECISION", "0"],
            "PRECISION must be positive",
        ),
        (
            &["k", "10", "1000", "PRECISION", "-1"],
            "PRECISION must be positive",
        ),
        (
            &["k", "10", "1000", "PRECISION", "1001"],
            "PRECISION must not exceed window_ms",
        ),
        (&["k", "10", "4097", "PRECISION", "1"], "too many buckets"),
        (&["k", "10", "60000", "PRECISION", "14"], "too many buckets"),
        (
            &["k", "10", "1000", "BURST", "5"],
            "syntax error near 'BURST': QUOTA.WINDOW takes no such option. Usage:",
        ),
        (
            &["k", "10", "1000", "COST"],
            "COST needs a value: COST cost. Usage: QUOTA.WINDOW",
        ),
        (
            &["k", "10", "1000", "PRECISION"],
            "PRECISION needs a value: PRECISION precision_ms. Usage: QUOTA.WINDOW",
        ),
        (
            &["k", "10", "1000", "AT"],
            "AT needs a value: AT unix_ms. Usage: QUOTA.WINDOW",
        ),
        (&["k", "10", "1000", "AT", "-1"], "AT must not be negative"),
        (
            &["k", "10", "1000", "AT", "253397030400001"],
            "AT must be at most 253397030400000",
        ),
        (
            &["k", "10", "1000000000000001", "PRECISION", "1000000000000"],
            "window_ms must be at most 1000000000000000",
        ),
        (
            &["k", "10", "9223372036854775807"],
            "window_ms must be at most",
        ),
        // The bound named even when the bucket count is also over.
        (
            &["k", "10", "1000000000000001", "PRECISION", "1"],
            "window_ms must be at most 1000000000000000",
        ),
    ];
    for (args, want) in cases {
        let mut full = vec!["QUOTA.WINDOW"];
        full.extend_from_slice(args);
        let (code, msg) = err(&mut c, &full);
        assert_eq!(code, "ERR", "{args:?}: {msg}");
        assert!(msg.contains(want), "{args:?}: {msg}");
    }
    assert!(keys(&mut c).is_empty());
    // Without limit and window_ms the call is the config form: a key without a stored
    // configuration (here none at all) is refused.
    assert_eq!(err(&mut c, &["QUOTA.WINDOW", "k"]).0, "NOQUOTA");
    assert!(keys(&mut c).is_empty());
    // The bucket budget's edge is accepted; tokens are case-insensitive.
    assert_eq!(
        win(
            &mut c,
            &["k", "10", "4096", "precision", "1", "cost", "2", "peek"]
        )[0],
        1
    );
    assert_eq!(win(&mut c, &["k", "10", "60000", "PRECISION", "15"])[0], 1);
    // The longest window and the latest AT are accepted.
    assert_eq!(
        win(
            &mut c,
            &[
                "long",
                "10",
                "1000000000000000",
                "PRECISION",
                "1000000000000",
                "AT",
                "253397030400000"
            ]
        )[0],
        1
    );
}

#[test]
fn at_requires_the_test_clock() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let (code, msg) = err(&mut c, &["QUOTA.WINDOW", "k", "1", "1000", "AT", "5"]);
    assert_eq!(code, "ERR");
    assert!(msg.contains("test-clock"), "{msg}");
    assert!(!exists(&mut c, "k"));
}

#[test]
fn internal_commands_are_refused_from_clients() {
    let s = clock_server();
    let mut c = s.conn();
    let t = T0.to_string();
    let (code, msg) = err(&mut c, &["QUOTA.WAPPLY", "k", &t, "1000", "10", "1", "-1"]);
    assert_eq!(code, "ERR");
    assert!(msg.contains("internal"), "{msg}");
    let (code, msg) = err(&mut c, &["QUOTA.LOAD", "k", "rq-window", "1", "xx"]);
    assert_eq!(code, "ERR");
    assert!(msg.contains("internal"), "{msg}");
    assert!(!exists(&mut c, "k"));
}

#[test]
fn command_key_positions_route_in_cluster() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for args in [
        vec!["QUOTA.WINDOW", "tenant:{a}", "10", "1000"],
        vec!["QUOTA.WAPPLY", "tenant:{a}", "1", "1000", "10", "1", "-1"],
    ] {
        let keys: Vec<String> = redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg(&args)
            .query(&mut c)
            .unwrap();
        assert_eq!(keys, vec!["tenant:{a}".to_string()], "{args:?}");
    }
}

// ---------------------------------------------------------------- no write, no replication

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

/// The RESP form of a command, as the AOF holds it.
fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n{a}\r\n", a.len()).into_bytes());
    }
    out
}

#[test]
fn peek_and_denied_calls_write_and_replicate_nothing() {
    let s = Server::start_with_module_args(
        &["--appendonly", "yes", "--appendfsync", "always"],
        &["test-clock", "yes"],
    );
    let mut c = s.conn();
    let p = ["PRECISION", "1000"];
    // PEEK on a missing key creates nothing.
    assert_eq!(win_at(&mut c, "k", 1, 60_000, &["PEEK"], T0), [1, 1, 0, 0]);
    assert!(!exists(&mut c, "k"));
    assert_eq!(win_at(&mut c, "k", 1, 60_000, &p, T0), [1, 0, 0, 60_999]);
    let digest0 = digest(&mut c, "k");
    assert!(untouched(&mut c, "k", |c| {
        assert_eq!(
            win_at(c, "k", 1, 60_000, &["PRECISION", "1000", "PEEK"], T0 + 1),
            [0, 0, 60_998, 60_998]
        );
    }));
    assert!(untouched(&mut c, "k", |c| {
        assert_eq!(win_at(c, "k", 1, 60_000, &p, T0 + 2)[0], 0);
        assert_eq!(
            win_at(
                c,
                "k",
                1,
                60_000,
                &["PRECISION", "1000", "COST", "5"],
                T0 + 2
            )[2],
            -1
        );
    }));
    assert_eq!(digest(&mut c, "k"), digest0);
    // An admitted call does touch it.
    assert!(!untouched(&mut c, "k", |c| {
        assert_eq!(win_at(c, "k", 5, 60_000, &p, T0 + 3)[0], 1);
    }));
    // The AOF (the same stream replicas get) holds exactly the two admitted calls, fully
    // resolved: time, precision, cost and the absolute expiry; never QUOTA.WINDOW itself.
    let aof = incr_aof(&s);
    assert_eq!(
        count(&aof, b"QUOTA.WAPPLY"),
        2,
        "{}",
        String::from_utf8_lossy(&aof)
    );
    assert_eq!(count(&aof, b"QUOTA.WINDOW"), 0);
    let (at, expire) = (T0.to_string(), (T0 + 60_999).to_string());
    let packed = format!("{at} 60000 1000 1 {expire}");
    let first = resp(&["QUOTA.WAPPLY", "k", &packed]);
    assert_eq!(count(&aof, &first), 1, "{}", String::from_utf8_lossy(&aof));
}

// ---------------------------------------------------------------- concurrency and memory

#[test]
fn racing_clients_never_exceed_the_limit() {
    let s = Server::start(&[]);
    let port = s.port;
    let handles: Vec<_> = (0..32)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                    .unwrap()
                    .get_connection()
                    .unwrap();
                let mut remaining = Vec::new();
                for _ in 0..10 {
                    let r = win(&mut c, &["shared", "100", "3600000"]);
                    if r[0] == 1 {
                        remaining.push(r[1]);
                    } else {
                        assert!(r[2] > 0, "{r:?}");
                    }
                }
                remaining
            })
        })
        .collect();
    let mut all: Vec<i64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    all.sort_unstable();
    // 320 attempts, exactly 100 admitted, each seeing a distinct remaining 0..=99.
    assert_eq!(all, (0..100).collect::<Vec<i64>>());
    let mut c = s.conn();
    assert_eq!(
        win(&mut c, &["shared", "100", "3600000", "PEEK"])[..2],
        [0, 0]
    );
}

#[test]
fn memory_usage_is_bounded_by_buckets_not_by_rate() {
    let s = clock_server();
    let mut c = s.conn();
    // One call a second for 2 minutes, and 50 calls a second: the same 61 buckets.
    let fill = |c: &mut redis::Connection, key: &str, per_second: i64| {
        let mut pipe = redis::pipe();
        for sec in 0..120 {
            for j in 0..per_second {
                let at = T0 + sec * 1000 + j * (1000 / per_second);
                pipe.cmd("QUOTA.WINDOW")
                    .arg(key)
                    .arg(1_000_000_000i64)
                    .arg(60_000)
                    .arg("PRECISION")
                    .arg(1000)
                    .arg("AT")
                    .arg(at)
                    .ignore();
            }
        }
        let () = pipe.query(c).unwrap();
    };
    fill(&mut c, "slow", 1);
    fill(&mut c, "fast", 50);
    let one = {
        win_at(&mut c, "one", 10, 60_000, &["PRECISION", "1000"], T0);
        memory_usage(&mut c, "one")
    };
    let slow = memory_usage(&mut c, "slow");
    let fast = memory_usage(&mut c, "fast");
    assert_eq!(slow, fast, "memory must not depend on the rate");
    // Truthful: 61 held buckets of 8 bytes (u32 offsets and counts) show up...
    assert!(fast >= one + 60 * 8, "one={one} fast={fast}");
    // ...and nothing more: value struct + exactly 61 bucket slots + the key's own overhead,
    // within the 1 KiB goal of issue 5.
    assert!(fast <= 1024, "MEMORY USAGE {fast}");
    assert_eq!(
        win_at(
            &mut c,
            "fast",
            6000,
            60_000,
            &["PRECISION", "1000", "PEEK"],
            T0 + 119_999
        )[1],
        6000 - 50 * 60
    );
}

// ---------------------------------------------------------------- determinism and persistence

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

const WINDOW_KEYS: [&str; 4] = ["w:a", "w:b", "w:{c}", "w\u{1}bin"];

/// A random mix of QUOTA.WINDOW calls on the wall clock (windows from 50 ms to 60 s, varying
/// precision, cost, limit, PEEK; keys expiring and being recreated while it runs), plus a budget
/// key. Ends with one long-window call per key so that every key outlives the comparisons.
fn workload(c: &mut redis::Connection, seed: u64, ops: usize) {
    let mut rng = Rng(seed | 1);
    let shapes: [(i64, Option<i64>); 8] = [
        (50, None),
        (50, Some(1)),
        (200, Some(10)),
        (1000, None),
        (1000, Some(1)),
        (3000, Some(1)),
        (5000, Some(100)),
        (60_000, Some(1000)),
    ];
    ok(c, &["QUOTA.SET", "budget", "LIMIT", "1000000"]);
    for _ in 0..ops {
        let key = WINDOW_KEYS[rng.below(4) as usize];
        let (window, precision) = shapes[rng.below(shapes.len() as u64) as usize];
        let limit = (1 + rng.below(12)).to_string();
        let window = window.to_string();
        let cost = rng.below(4).to_string();
        let precision = precision.map(|p| p.to_string());
        let mut args = vec!["QUOTA.WINDOW", key, &limit, &window, "COST", &cost];
        if let Some(p) = &precision {
            args.extend(["PRECISION", p.as_str()]);
        }
        if rng.below(8) == 0 {
            args.push("PEEK");
        }
        ok(c, &args);
        match rng.below(20) {
            0 => {
                ok(c, &["QUOTA.CHARGE", "budget", "3", "FORCE"]);
            }
            1..=4 => std::thread::sleep(Duration::from_millis(rng.below(4))),
            _ => {}
        }
    }
    for key in WINDOW_KEYS {
        ok(
            c,
            &["QUOTA.WINDOW", key, "1000000", "60000", "PRECISION", "1000"],
        );
    }
}

/// (key, digest, absolute expiry) of every key.
fn state(c: &mut redis::Connection) -> Vec<(String, String, i64)> {
    keys(c)
        .into_iter()
        .map(|k| {
            let d = digest(c, &k);
            let e = pexpiretime(c, &k);
            (k, d, e)
        })
        .collect()
}

#[test]
fn replica_reaches_identical_values_and_expiries() {
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    let mut m = master.conn();
    let mut r = replica.conn();
    // Something before the link exists: it reaches the replica in the initial RDB sync.
    ok(
        &mut m,
        &["QUOTA.WINDOW", "early", "5", "60000", "COST", "2"],
    );
    ok(
        &mut r,
        &["REPLICAOF", "127.0.0.1", &master.port.to_string()],
    );
    wait_link_up(&mut r);
    workload(&mut m, 42, 2000);
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(acked, 1);
    let ms = state(&mut m);
    assert_eq!(ms.len(), 6, "{ms:?}");
    assert!(ms
        .iter()
        .filter(|(k, _, _)| k != "budget")
        .all(|(_, _, e)| *e > 0));
    assert_eq!(ms, state(&mut r));
    // The replica never writes on its own: nothing moves while time passes.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(ms, state(&mut r));
    // A counting call is a write: refused on the replica.
    let (code, _) = err(&mut r, &["QUOTA.WINDOW", "w:a", "10", "1000"]);
    assert_eq!(code, "READONLY");
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

/// The rewritten base AOF file (the only `*.base.aof`).
fn base_aof_path(s: &Server) -> std::path::PathBuf {
    std::fs::read_dir(s.dir.join("appendonlydir"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".base.aof"))
        .expect("a base AOF")
}

fn aof_round_trip(preamble: &str) {
    let mut s = Server::start(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--aof-use-rdb-preamble",
        preamble,
    ]);
    let mut c = s.conn();
    workload(&mut c, 7, 1000);
    let before = state(&mut c);
    assert_eq!(before.len(), 5);
    // Replay of the incremental AOF (QUOTA.WAPPLY effects).
    s.restart();
    let mut c = s.conn();
    assert_eq!(before, state(&mut c), "AOF replay (preamble {preamble})");
    // Rewrite (QUOTA.LOAD + PEXPIREAT, or the RDB preamble) and replay again.
    ok(&mut c, &["BGREWRITEAOF"]);
    wait_rewrite(&mut c);
    std::thread::sleep(Duration::from_millis(100));
    if preamble == "no" {
        let base = std::fs::read(base_aof_path(&s)).unwrap();
        assert_eq!(count(&base, b"QUOTA.LOAD"), 5);
        assert_eq!(count(&base, b"rq-window"), 4);
        assert_eq!(count(&base, b"rq-budget"), 1);
        assert_eq!(count(&base, b"PEXPIREAT"), 4);
    }
    workload(&mut c, 8, 300);
    let before = state(&mut c);
    s.restart();
    let mut c = s.conn();
    assert_eq!(
        before,
        state(&mut c),
        "AOF rewrite + replay (preamble {preamble})"
    );
    if preamble == "no" {
        // AOF files written before windows existed carry the legacy `QUOTA.LOAD key encver
        // payload` (budgets only): they still load.
        ok(&mut c, &["BGREWRITEAOF"]);
        wait_rewrite(&mut c);
        std::thread::sleep(Duration::from_millis(100));
        let before = state(&mut c);
        s.shutdown();
        let path = base_aof_path(&s);
        let base = std::fs::read(&path).unwrap();
        let new_form = b"*5\r\n$10\r\nQUOTA.LOAD\r\n$6\r\nbudget\r\n$9\r\nrq-budget\r\n";
        let legacy = b"*4\r\n$10\r\nQUOTA.LOAD\r\n$6\r\nbudget\r\n";
        assert_eq!(count(&base, new_form), 1);
        let patched = replace(&base, new_form, legacy);
        std::fs::write(&path, patched).unwrap();
        s.kill_and_restart();
        let mut c = s.conn();
        assert_eq!(before, state(&mut c), "legacy QUOTA.LOAD");
    }
}

fn replace(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let at = hay.windows(from.len()).position(|w| w == from).unwrap();
    [&hay[..at], to, &hay[at + from.len()..]].concat()
}

#[test]
fn aof_restart_without_rdb_preamble() {
    aof_round_trip("no");
}

#[test]
fn aof_restart_with_rdb_preamble() {
    aof_round_trip("yes");
}

#[test]
fn debug_reload_dump_restore_copy_rename_are_exact() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    workload(&mut c, 99, 600);
    let before = state(&mut c);
    ok(&mut c, &["DEBUG", "RELOAD"]);
    assert_eq!(before, state(&mut c));

    let d0 = digest(&mut c, "w:a");
    let e0 = pexpiretime(&mut c, "w:a");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("w:a").query(&mut c).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("restored")
        .arg(e0)
        .arg(&dump)
        .arg("ABSTTL")
        .query(&mut c)
        .unwrap();
    assert_eq!(digest(&mut c, "restored"), d0);
    assert_eq!(pexpiretime(&mut c, "restored"), e0);
    ok(&mut c, &["COPY", "w:a", "copied"]);
    assert_eq!(digest(&mut c, "copied"), d0);
    assert_eq!(pexpiretime(&mut c, "copied"), e0);
    ok(&mut c, &["RENAME", "w:a", "renamed"]);
    assert_eq!(digest(&mut c, "renamed"), d0);
    // The copies decide alike.
    let a = win(
        &mut c,
        &["copied", "1000000", "60000", "PRECISION", "1000", "PEEK"],
    );
    let b = win(
        &mut c,
        &["renamed", "1000000", "60000", "PRECISION", "1000", "PEEK"],
    );
    assert_eq!(a[..2], b[..2]);

    // Corrupt RESTORE payloads (checksum skipped so they reach rdb_load) are refused or
    // yield a valid value; never a crash.
    ok(&mut c, &["DEBUG", "SET-SKIP-CHECKSUM-VALIDATION", "1"]);
    let body = dump.len() - 10;
    for i in 0..body {
        for bit in 0..8 {
            let mut d = dump.clone();
            d[i] ^= 1 << bit;
            let r: redis::RedisResult<()> = redis::cmd("RESTORE")
                .arg("x")
                .arg(0)
                .arg(&d)
                .arg("REPLACE")
                .query(&mut c);
            if r.is_ok() && int(&ok(&mut c, &["EXISTS", "x"])) == 1 {
                if let Ok(Value::SimpleString(t)) = q(&mut c, &["TYPE", "x"]) {
                    if t == "rq-window" {
                        win(&mut c, &["x", "10", "60000", "PRECISION", "1000", "PEEK"]);
                    }
                }
            }
        }
    }
    for cut in 0..body {
        let d = [&dump[..cut], &dump[body..]].concat();
        let _: redis::RedisResult<()> = redis::cmd("RESTORE")
            .arg("y")
            .arg(0)
            .arg(&d)
            .arg("REPLACE")
            .query(&mut c);
    }
    assert_eq!(ok(&mut c, &["PING"]), Value::SimpleString("PONG".into()));
}

#[test]
fn recorded_calls_publish_a_keyspace_event() {
    let s = clock_server();
    let mut c = s.conn();
    ok(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "Ed"]);
    let mut sub = s.conn();
    sub.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut ps = sub.as_pubsub();
    ps.subscribe("__keyevent@0__:quota.window").unwrap();
    assert_eq!(win_at(&mut c, "k", 1, 1000, &[], T0)[0], 1);
    assert_eq!(win_at(&mut c, "k", 1, 1000, &[], T0)[0], 0);
    assert_eq!(win_at(&mut c, "k", 1, 1000, &["PEEK"], T0)[0], 0);
    let msg = ps.get_message().unwrap();
    assert_eq!(msg.get_payload::<String>().unwrap(), "k");
    // Only the admitted call published.
    assert!(ps.get_message().is_err());
}
