//! Bad input: wrong arity, non-numbers, negatives, huge numbers, 1 MB ids, binary key names,
//! wrong types. Each gets the right coded error, the key is unchanged, and the server lives.

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
        (["COST", "-1", "COST", "1"], "COST must not be negative"),
        (
            ["PRECISION", "0", "PRECISION", "10"],
            "PRECISION must be positive",
        ),
        (
            ["PRECISION", "-1", "PRECISION", "10"],
            "PRECISION must be positive",
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

/// The whole error line (code and text) of a call that must fail.
fn error_line(c: &mut redis::Connection, args: &[&str]) -> String {
    match q(c, args) {
        Ok(v) => panic!("{args:?} should fail, got {v:?}"),
        Err(e) => format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or("")),
    }
}

const RESERVE_USAGE: &str =
    "Usage: QUOTA.RESERVE key amount [ID id] [TTL ttl_ms] [KEEP keep] [AT unix_ms]";
const MRESERVE_USAGE: &str = "Usage: QUOTA.MRESERVE numkeys key [key ...] amount [amount ...] \
     [ID id] [TTL ttl_ms] [KEEP keep] [AT unix_ms]";
const WINDOW_USAGE: &str = "Usage: QUOTA.WINDOW key [limit window_ms] [COST cost] \
     [PRECISION precision_ms] [PEEK] [AT unix_ms]";
const SET_USAGE: &str = "Usage: QUOTA.SET key [LIMIT limit] [USED used] [OVERDRAFT overdraft] \
     [MAXRESERVE max_reserve] [TTL ttl_ms] [PERIOD NONE|MINUTE|HOUR|DAY|WEEK|MONTH] [TZ zone] \
     [ANCHOR anchor_ms] [ONEXPIRE RELEASE|CHARGE|ELAPSED] [UNIT MS|S|MIN|NONE] \
     [STREAM stream_key] [STREAMMAXLEN stream_maxlen] [NX|XX] [AT unix_ms] \
     | QUOTA.SET key WINDOW limit window_ms [PRECISION precision_ms] [NX|XX] [AT unix_ms]";

/// The usage line of QUOTA.SET's WINDOW form: what its errors give once WINDOW is read.
const SET_WINDOW_USAGE: &str =
    "Usage: QUOTA.SET key WINDOW limit window_ms [PRECISION precision_ms] [NX|XX] [AT unix_ms]";

/// Error lines name the argument at fault and say what to do next (issue 23): the argument's
/// name, the value got, the key taken for an option, and the command's usage line. Codes and
/// Redis's arity sentence stay as Redis has them.
#[test]
fn error_lines_name_the_argument_and_give_the_usage() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "b:1", "LIMIT", "100"]);
    ok(&mut c, &["QUOTA.RESERVE", "b:1", "10", "ID", "p"]);
    let before = digest(&mut c, "b:1");
    let cases: Vec<(Vec<&str>, String)> = vec![
        // The three a new user met (issue 23).
        (
            vec!["QUOTA.RESERVE", "b:1", "ID", "x", "5"],
            format!(
                "ERR amount is not an integer or out of range: got 'ID', an option: amount \
                 comes before the options. {RESERVE_USAGE}"
            ),
        ),
        (
            vec!["QUOTA.RESERVE", "k", "5", "TTL"],
            format!("ERR TTL needs a value: TTL ttl_ms. {RESERVE_USAGE}"),
        ),
        (
            vec!["QUOTA.SET", "LIMIT", "10", "b:1"],
            format!(
                "ERR syntax error near '10': the key was taken to be 'LIMIT': the key comes \
                 first. {SET_USAGE}"
            ),
        ),
        // Too few arguments: Redis's sentence, then the usage.
        (
            vec!["QUOTA.RESERVE", "b:1"],
            format!("ERR wrong number of arguments for 'QUOTA.RESERVE' command. {RESERVE_USAGE}"),
        ),
        (
            vec!["QUOTA.SETTLE", "b:1", "p"],
            "ERR wrong number of arguments for 'QUOTA.SETTLE' command. Usage: QUOTA.SETTLE key \
             id actual|ELAPSED [AT unix_ms]"
                .into(),
        ),
        (
            vec!["QUOTA.ROLLBACK", "b:1"],
            "ERR wrong number of arguments for 'QUOTA.ROLLBACK' command. Usage: \
             QUOTA.ROLLBACK key id [AT unix_ms]"
                .into(),
        ),
        (
            vec!["QUOTA.EXTEND", "b:1", "p"],
            "ERR wrong number of arguments for 'QUOTA.EXTEND' command. Usage: QUOTA.EXTEND key \
             id ttl_ms [AT unix_ms]"
                .into(),
        ),
        (
            vec!["QUOTA.CHARGE", "b:1"],
            "ERR wrong number of arguments for 'QUOTA.CHARGE' command. Usage: QUOTA.CHARGE key \
             amount [ID id] [FORCE] [KEEP keep] [AT unix_ms]"
                .into(),
        ),
        // Redis checks the key's presence itself (arity -2): its own sentence.
        (
            vec!["QUOTA.INFO"],
            "ERR wrong number of arguments for 'QUOTA.INFO' command".into(),
        ),
        // A positional argument that is not an integer.
        (
            vec!["QUOTA.SETTLE", "b:1", "p", "all"],
            "ERR actual is not an integer or out of range: got 'all'. Usage: QUOTA.SETTLE key \
             id actual|ELAPSED [AT unix_ms]"
                .into(),
        ),
        (
            vec!["QUOTA.EXTEND", "b:1", "p", "5s"],
            "ERR ttl_ms is not an integer or out of range: got '5s'. Usage: QUOTA.EXTEND key \
             id ttl_ms [AT unix_ms]"
                .into(),
        ),
        (
            vec!["QUOTA.CHARGE", "b:1", "FORCE", "5"],
            "ERR amount is not an integer or out of range: got 'FORCE', an option: amount \
             comes before the options. Usage: QUOTA.CHARGE key amount [ID id] [FORCE] \
             [KEEP keep] [AT unix_ms]"
                .into(),
        ),
        // An option's value that is not an integer, or is missing.
        (
            vec!["QUOTA.RESERVE", "b:1", "5", "TTL", "1.5"],
            format!(
                "ERR value of TTL is not an integer or out of range: got '1.5'. {RESERVE_USAGE}"
            ),
        ),
        (
            vec!["QUOTA.SET", "b:1", "LIMIT", "lots"],
            format!("ERR value of LIMIT is not an integer or out of range: got 'lots'. {SET_USAGE}"),
        ),
        (
            vec!["QUOTA.SET", "b:1", "PERIOD"],
            format!("ERR PERIOD needs a value: PERIOD NONE|MINUTE|HOUR|DAY|WEEK|MONTH. {SET_USAGE}"),
        ),
        (
            vec!["QUOTA.PENDING", "b:1", "COUNT"],
            "ERR COUNT needs a value: COUNT count. Usage: QUOTA.PENDING key [COUNT count] \
             [AT unix_ms]"
                .into(),
        ),
        (
            vec!["QUOTA.INFO", "b:1", "AT"],
            "ERR AT needs a value: AT unix_ms. Usage: QUOTA.INFO key [AT unix_ms]".into(),
        ),
        // An unknown option, or one more argument than the command takes.
        (
            vec!["QUOTA.RESERVE", "b:1", "5", "FORCE"],
            format!("ERR syntax error near 'FORCE': QUOTA.RESERVE takes no such option. {RESERVE_USAGE}"),
        ),
        (
            vec!["QUOTA.SETTLE", "b:1", "p", "1", "2"],
            "ERR syntax error near '2': QUOTA.SETTLE takes no such option. Usage: QUOTA.SETTLE \
             key id actual|ELAPSED [AT unix_ms]"
                .into(),
        ),
        (
            vec!["QUOTA.INFO", "b:1", "extra"],
            "ERR syntax error near 'extra': QUOTA.INFO takes no such option. Usage: QUOTA.INFO \
             key [AT unix_ms]"
                .into(),
        ),
        // The multi-key commands and the window configuration forms.
        (
            vec!["QUOTA.MRESERVE", "1", "b:1"],
            format!("ERR wrong number of arguments for 'QUOTA.MRESERVE' command. {MRESERVE_USAGE}"),
        ),
        (
            vec!["QUOTA.MRESERVE", "1", "b:1", "5", "FORCE"],
            format!(
                "ERR syntax error near 'FORCE': QUOTA.MRESERVE takes no such option. \
                 {MRESERVE_USAGE}"
            ),
        ),
        (
            vec!["QUOTA.MRESERVE", "1", "b:1", "5", "TTL"],
            format!("ERR TTL needs a value: TTL ttl_ms. {MRESERVE_USAGE}"),
        ),
        // The multi-key commands name a repeated argument too.
        (
            vec!["QUOTA.MRESERVE", "1", "b:1", "abc"],
            format!("ERR amount is not an integer or out of range: got 'abc'. {MRESERVE_USAGE}"),
        ),
        (
            vec!["QUOTA.MSETTLE", "1", "b:1", "p", "abc"],
            "ERR actual is not an integer or out of range: got 'abc'. Usage: QUOTA.MSETTLE \
             numkeys key [key ...] id actual|ELAPSED [actual|ELAPSED ...] [AT unix_ms]"
                .into(),
        ),
        (
            vec!["QUOTA.MEXTEND", "1", "b:1", "p", "abc"],
            "ERR ttl_ms is not an integer or out of range: got 'abc'. Usage: QUOTA.MEXTEND \
             numkeys key [key ...] id ttl_ms [AT unix_ms]"
                .into(),
        ),
        (
            vec!["QUOTA.SET", "w", "WINDOW"],
            format!(
                "ERR WINDOW needs a value: WINDOW limit window_ms [PRECISION precision_ms]. \
                 {SET_WINDOW_USAGE}"
            ),
        ),
        (
            vec!["QUOTA.SET", "w", "WINDOW", "10"],
            format!(
                "ERR WINDOW needs window_ms after the limit: WINDOW limit window_ms \
                 [PRECISION precision_ms]. {SET_WINDOW_USAGE}"
            ),
        ),
        (
            vec!["QUOTA.SET", "w", "WINDOW", "10", "abc"],
            format!("ERR window_ms is not an integer or out of range: got 'abc'. {SET_WINDOW_USAGE}"),
        ),
        (
            vec!["QUOTA.SET", "w", "WINDOW", "abc", "1000"],
            format!("ERR limit is not an integer or out of range: got 'abc'. {SET_WINDOW_USAGE}"),
        ),
        (
            vec!["QUOTA.SET", "w", "WINDOW", "10", "1000", "PRECISION"],
            format!("ERR PRECISION needs a value: PRECISION precision_ms. {SET_WINDOW_USAGE}"),
        ),
        // WINDOW with a budget option, after or before it: a key is one or the other.
        (
            vec!["QUOTA.SET", "w", "WINDOW", "10", "1000", "LIMIT", "5"],
            format!(
                "ERR syntax error near 'LIMIT': WINDOW cannot be combined with budget options \
                 such as LIMIT (a key is a window or a budget). {SET_WINDOW_USAGE}"
            ),
        ),
        (
            vec!["QUOTA.SET", "w", "WINDOW", "10", "1000", "NX", "ttl", "5"],
            format!(
                "ERR syntax error near 'ttl': WINDOW cannot be combined with budget options \
                 such as TTL (a key is a window or a budget). {SET_WINDOW_USAGE}"
            ),
        ),
        (
            vec!["QUOTA.SET", "w", "LIMIT", "5", "WINDOW", "10", "1000"],
            format!(
                "ERR syntax error near 'WINDOW': WINDOW cannot be combined with budget options \
                 such as LIMIT (a key is a window or a budget). {SET_USAGE}"
            ),
        ),
        (
            vec!["QUOTA.SET", "w", "NX", "window", "10", "1000"],
            format!("ERR syntax error near 'window': WINDOW must come right after the key. {SET_USAGE}"),
        ),
        // One amount (actual) too many: a number where an option was expected.
        (
            vec!["QUOTA.MRESERVE", "2", "b:1", "b:2", "1", "2", "3"],
            format!(
                "ERR syntax error near '3': expected 2 amounts, one per key (numkeys is 2), got \
                 more. {MRESERVE_USAGE}"
            ),
        ),
        (
            vec!["QUOTA.MRESERVE", "1", "b:1", "5", "ID", "x", "6"],
            format!(
                "ERR syntax error near '6': expected 1 amount, one per key (numkeys is 1), got \
                 more. {MRESERVE_USAGE}"
            ),
        ),
        (
            vec!["QUOTA.MRESERVE", "1", "b:1", "5", "BOGUS"],
            format!("ERR syntax error near 'BOGUS': QUOTA.MRESERVE takes no such option. {MRESERVE_USAGE}"),
        ),
        (
            vec!["QUOTA.MSETTLE", "1", "b:1", "p", "5", "ELAPSED"],
            "ERR syntax error near 'ELAPSED': expected 1 actual, one per key (numkeys is 1), \
             got more. Usage: QUOTA.MSETTLE numkeys key [key ...] id actual|ELAPSED \
             [actual|ELAPSED ...] [AT unix_ms]"
                .into(),
        ),
        (
            vec!["QUOTA.WINDOW", "w", "PRECISION", "5"],
            format!(
                "ERR syntax error near 'PRECISION': PRECISION goes with limit and window_ms \
                 (without them the key's stored configuration is used, precision included). \
                 {WINDOW_USAGE}"
            ),
        ),
        (
            vec!["QUOTA.WINDOW", "w", "FOO"],
            format!("ERR syntax error near 'FOO': QUOTA.WINDOW takes no such option. {WINDOW_USAGE}"),
        ),
        (
            vec!["QUOTA.WINDOW", "w", "COST", "x"],
            format!("ERR value of COST is not an integer or out of range: got 'x'. {WINDOW_USAGE}"),
        ),
        (
            vec!["QUOTA.WINDOW", "w", "10", "1s"],
            format!("ERR window_ms is not an integer or out of range: got '1s'. {WINDOW_USAGE}"),
        ),
        // Value checks name the argument and the rule.
        (
            vec!["QUOTA.RESERVE", "b:1", "-1"],
            "ERR amount must not be negative".into(),
        ),
        (
            vec!["QUOTA.SET", "b:1", "TZ", "Mars/Base"],
            "ERR unknown time zone 'Mars/Base': TZ takes an IANA name such as UTC or Europe/Paris"
                .into(),
        ),
        (
            vec!["QUOTA.SET", "new", "USED", "5"],
            "ERR LIMIT is required to create a budget: QUOTA.SET key LIMIT n [option ...] \
             (see QUOTA.HELP)"
                .into(),
        ),
        (
            vec!["QUOTA.WINDOW", "w", "10", "1000", "PRECISION", "2000"],
            "ERR PRECISION must not exceed window_ms".into(),
        ),
    ];
    for (args, want) in &cases {
        assert_eq!(&error_line(&mut c, args), want, "{args:?}");
    }
    assert_eq!(digest(&mut c, "b:1"), before);
    assert_eq!(keys(&mut c), ["b:1"]);
}

/// With up to 16 keys, an M* command's WRONGTYPE or NOQUOTA names the listed key at fault.
#[test]
fn multi_key_errors_name_the_key_at_fault() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let _: () = redis::cmd("SET").arg("s").arg("1").query(&mut c).unwrap();
    q(&mut c, &["QUOTA.SET", "b", "LIMIT", "10"]).unwrap();
    q(&mut c, &["QUOTA.WINDOW", "w", "5", "1000"]).unwrap();
    assert_eq!(
        error_line(&mut c, &["QUOTA.MRESERVE", "2", "b", "s", "1", "1"]),
        "WRONGTYPE Operation against a key holding the wrong kind of value (key 's')"
    );
    assert_eq!(
        error_line(&mut c, &["QUOTA.MSETTLE", "2", "b", "nope", "x", "1", "1"]),
        "NOQUOTA no budget or window at a listed key (create it with QUOTA.SET) (key 'nope')"
    );
    assert_eq!(
        error_line(&mut c, &["QUOTA.MRESERVE", "2", "b", "w", "1", "1"]),
        "NOQUOTA no window configuration at this key (create it with QUOTA.SET key WINDOW \
         limit window_ms) (key 'w')"
    );
    // The id's errors name the key too: the first listed key at fault.
    q(&mut c, &["QUOTA.SET", "b2", "LIMIT", "10"]).unwrap();
    q(&mut c, &["QUOTA.RESERVE", "b2", "1", "ID", "r"]).unwrap();
    q(&mut c, &["QUOTA.SETTLE", "b2", "r", "1"]).unwrap();
    assert_eq!(
        error_line(&mut c, &["QUOTA.MSETTLE", "2", "b", "b2", "zz", "1", "1"]),
        "NORESERVATION no reservation with id 'zz' (key 'b')"
    );
    assert_eq!(
        error_line(&mut c, &["QUOTA.MSETTLE", "2", "b", "b2", "r", "1", "1"]),
        "NORESERVATION no reservation with id 'r' (key 'b')"
    );
    for cmd in [
        vec!["QUOTA.MROLLBACK", "1", "b2", "r"],
        vec!["QUOTA.MEXTEND", "1", "b2", "r", "1000"],
    ] {
        let line = error_line(&mut c, &cmd);
        assert!(
            line.starts_with("CONFLICT id 'r' is settled: ") && line.ends_with(" (key 'b2')"),
            "{cmd:?}: {line}"
        );
    }
    // A retry that lists a key the reservation did not: that key is named.
    q(&mut c, &["QUOTA.MRESERVE", "1", "b", "1", "ID", "m"]).unwrap();
    let b_before = digest(&mut c, "b");
    assert_eq!(
        error_line(
            &mut c,
            &["QUOTA.MRESERVE", "2", "b", "w2", "1", "1", "ID", "m"]
        ),
        "NOQUOTA no budget or window at a listed key (create it with QUOTA.SET) (key 'w2')"
    );
    q(&mut c, &["QUOTA.SET", "w2", "WINDOW", "5", "1000"]).unwrap();
    let w2_before = digest(&mut c, "w2");
    assert_eq!(
        error_line(
            &mut c,
            &["QUOTA.MRESERVE", "2", "b", "w2", "1", "1", "ID", "m"]
        ),
        "CONFLICT id 'm' is pending on other listed keys: a retry must name the same keys and \
         amounts, and this window key does not remember it (its bucket left the window, or it \
         was not listed): a retry after the window is a new request (a new ID) (key 'w2')"
    );
    assert_eq!(
        error_line(
            &mut c,
            &["QUOTA.MRESERVE", "2", "w2", "b", "1", "2", "ID", "m"]
        ),
        "CONFLICT id 'm' is pending: pending with a different amount (key 'b')"
    );
    assert_eq!(digest(&mut c, "b"), b_before);
    assert_eq!(digest(&mut c, "w2"), w2_before);
    // A budget whose usage stream key holds another type: the budget is named.
    q(&mut c, &["QUOTA.SET", "b3", "LIMIT", "10", "STREAM", "st"]).unwrap();
    q(
        &mut c,
        &["QUOTA.MRESERVE", "2", "b", "b3", "1", "1", "ID", "u"],
    )
    .unwrap();
    let _: () = redis::cmd("SET").arg("st").arg("x").query(&mut c).unwrap();
    let b3_before = digest(&mut c, "b3");
    assert_eq!(
        error_line(&mut c, &["QUOTA.MSETTLE", "2", "b", "b3", "u", "1", "1"]),
        "WRONGTYPE the usage stream key holds a value that is not a stream (key 'b3')"
    );
    assert_eq!(digest(&mut c, "b3"), b3_before);
    // Nothing was taken on the budget listed first (but the reservations "m" and "u").
    let info: Vec<Value> = redis::cmd("QUOTA.INFO").arg("b").query(&mut c).unwrap();
    assert_eq!(info[5], Value::Int(2), "reserved");
}

/// QUOTA.WINDOW near i64::MAX (commands.md, QUOTA.WINDOW errors): a cost that does not fit
/// the limit is a denial, even where counted + cost would leave i64; `ERR overflow` only when
/// what the key holds — costs kept from before `window_ms` was shortened, until they leave the
/// longer horizon — plus an admitted cost would, and it changes nothing.
#[test]
fn window_costs_near_i64_max_are_denied_and_overflow_only_beyond_the_window() {
    let s = Server::start_with_module_args(&[], &["test-clock", "yes"]);
    let mut c = s.conn();
    let max = i64::MAX.to_string();
    let t0: i64 = 4_000_000_000_000;
    let at = |dt: i64| (t0 + dt).to_string();
    let window = |c: &mut redis::Connection, window_ms: &str, cost: &str, dt: i64| {
        q(
            c,
            &[
                "QUOTA.WINDOW",
                "w",
                &max,
                window_ms,
                "COST",
                cost,
                "AT",
                &at(dt),
            ],
        )
    };
    let r = items(&window(&mut c, "10000", &max, 0).unwrap());
    assert_eq!((int(&r[0]), int(&r[1])), (1, 0));
    // Counted (i64::MAX) + 1 would leave i64: denied, not an error.
    let r = items(&window(&mut c, "10000", "1", 0).unwrap());
    assert_eq!(int(&r[0]), 0, "{r:?}");
    // A shorter window admits the cost (the first one left it), but the key still holds the
    // first cost for the longer horizon: the sum would leave i64.
    let before = digest(&mut c, "w");
    let e = window(&mut c, "1000", &max, 3000).unwrap_err();
    assert_eq!(
        format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or("")),
        "ERR overflow"
    );
    assert_eq!(digest(&mut c, "w"), before);
    // Once the first cost has left the horizon, the same call is admitted.
    let r = items(&window(&mut c, "1000", &max, 10_500).unwrap());
    assert_eq!(int(&r[0]), 1, "{r:?}");
    // The same on a configured key (`QUOTA.SET key WINDOW`, then `QUOTA.WINDOW key COST n`):
    // the same error, and nothing changes.
    let set = |c: &mut redis::Connection, window_ms: &str, dt: i64| {
        q(
            c,
            &["QUOTA.SET", "cw", "WINDOW", &max, window_ms, "AT", &at(dt)],
        )
        .unwrap();
    };
    set(&mut c, "10000", 20_000);
    let cost = |c: &mut redis::Connection, n: &str, dt: i64| {
        q(c, &["QUOTA.WINDOW", "cw", "COST", n, "AT", &at(dt)])
    };
    assert_eq!(int(&items(&cost(&mut c, &max, 20_000).unwrap())[0]), 1);
    set(&mut c, "1000", 20_010);
    let before = digest(&mut c, "cw");
    let e = cost(&mut c, &max, 23_000).unwrap_err();
    assert_eq!(
        format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or("")),
        "ERR overflow"
    );
    assert_eq!(digest(&mut c, "cw"), before);
    let r = items(&cost(&mut c, &max, 30_500).unwrap());
    assert_eq!(int(&r[0]), 1, "{r:?}");
}

/// Issue 19's error nits: numkeys' range is checked first by every M* command (before the
/// arity); a TTL out of range is an argument error naming no key (MEXTEND's names `ttl_ms`);
/// `WINDOW` given twice says so; NX / XX reply 0 before the stream key's type is looked at.
#[test]
fn multi_key_and_set_argument_errors_are_consistent() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    q(&mut c, &["QUOTA.SET", "{e}:b", "LIMIT", "10"]).unwrap();
    q(&mut c, &["QUOTA.RESERVE", "{e}:b", "1", "ID", "p1"]).unwrap();
    let _: () = redis::cmd("SET")
        .arg("{e}:str")
        .arg("x")
        .query(&mut c)
        .unwrap();
    let before = (digest(&mut c, "{e}:b"), digest(&mut c, "{e}:str"));
    let numkeys = "ERR numkeys must be between 1 and 16";
    let huge = "1000000000000001";
    let cases: Vec<(Vec<&str>, String)> = vec![
        (vec!["QUOTA.MRESERVE", "0", "k", "p1"], numkeys.into()),
        (vec!["QUOTA.MSETTLE", "0", "k", "p1"], numkeys.into()),
        (vec!["QUOTA.MROLLBACK", "0", "k", "p1"], numkeys.into()),
        (vec!["QUOTA.MEXTEND", "0", "k", "p1"], numkeys.into()),
        (vec!["QUOTA.MSETTLE", "17", "k"], numkeys.into()),
        (vec!["QUOTA.MEXTEND", "-1"], numkeys.into()),
        (
            vec!["QUOTA.MRESERVE", "1", "{e}:b", "1", "TTL", huge],
            "ERR TTL must be positive and at most 1000000000000000 ms".into(),
        ),
        (
            vec!["QUOTA.MRESERVE", "1", "{e}:b", "1", "TTL", "0"],
            "ERR TTL must be positive and at most 1000000000000000 ms".into(),
        ),
        (
            vec!["QUOTA.MEXTEND", "1", "{e}:b", "p1", huge],
            "ERR ttl_ms must be positive and at most 1000000000000000 ms".into(),
        ),
        (
            vec!["QUOTA.MEXTEND", "1", "{e}:b", "p1", "0"],
            "ERR ttl_ms must be positive and at most 1000000000000000 ms".into(),
        ),
        // The single-key commands word their bound as the multi-key ones: the option TTL,
        // the argument ttl_ms, the same bound for 0 and for too much.
        (
            vec!["QUOTA.RESERVE", "{e}:b", "1", "TTL", "0"],
            "ERR TTL must be positive and at most 1000000000000000 ms".into(),
        ),
        (
            vec!["QUOTA.RESERVE", "{e}:b", "1", "TTL", huge],
            "ERR TTL must be positive and at most 1000000000000000 ms".into(),
        ),
        (
            vec!["QUOTA.SET", "{e}:b", "TTL", "-1"],
            "ERR TTL must be positive and at most 1000000000000000 ms".into(),
        ),
        (
            vec!["QUOTA.EXTEND", "{e}:b", "p1", "0"],
            "ERR ttl_ms must be positive and at most 1000000000000000 ms".into(),
        ),
        (
            vec!["QUOTA.EXTEND", "{e}:b", "p1", huge],
            "ERR ttl_ms must be positive and at most 1000000000000000 ms".into(),
        ),
        (
            vec![
                "QUOTA.SET",
                "nw",
                "WINDOW",
                "5",
                "1000",
                "WINDOW",
                "6",
                "1000",
            ],
            format!(
                "ERR syntax error near 'WINDOW': WINDOW is given twice (one configuration per \
                 call). {SET_WINDOW_USAGE}"
            ),
        ),
        // Something would be set: the stream key's type is checked.
        (
            vec!["QUOTA.SET", "{e}:b", "STREAM", "{e}:str"],
            "WRONGTYPE the usage stream key holds a value that is not a stream".into(),
        ),
        (
            vec![
                "QUOTA.SET",
                "{e}:new",
                "LIMIT",
                "5",
                "STREAM",
                "{e}:str",
                "NX",
            ],
            "WRONGTYPE the usage stream key holds a value that is not a stream".into(),
        ),
    ];
    for (args, want) in &cases {
        assert_eq!(&error_line(&mut c, args), want, "{args:?}");
    }
    // NX on an existing budget, XX on a missing key: 0 first, nothing set, nothing checked.
    for args in [
        vec!["QUOTA.SET", "{e}:b", "STREAM", "{e}:str", "NX"],
        vec![
            "QUOTA.SET",
            "{e}:new",
            "LIMIT",
            "5",
            "STREAM",
            "{e}:str",
            "XX",
        ],
    ] {
        assert_eq!(q(&mut c, &args).unwrap(), Value::Int(0), "{args:?}");
    }
    assert_eq!((digest(&mut c, "{e}:b"), digest(&mut c, "{e}:str")), before);
    assert_eq!(keys(&mut c), ["{e}:b", "{e}:str"]);
}
