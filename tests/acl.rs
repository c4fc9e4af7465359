//! Access control (issue 6, item 8): the ACL users shown in docs/operations.md, run exactly as
//! written there. A gateway may only reserve, settle, roll back, extend and count windows on
//! `quota:*` keys; an admin may also create and change budgets; a metrics user may run the
//! redis_exporter script in contrib/. Everything else is refused with NOPERM.

mod common;
use common::*;
use std::collections::BTreeMap;

/// The `ACL SETUSER` lines of docs/operations.md, by user name.
fn documented_users() -> BTreeMap<String, Vec<String>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md");
    let doc = std::fs::read_to_string(path).unwrap();
    doc.lines()
        .filter(|l| l.starts_with("ACL SETUSER "))
        .map(|l| {
            let words: Vec<String> = l.split_whitespace().map(str::to_string).collect();
            (words[2].clone(), words)
        })
        .collect()
}

/// Creates every documented user on `s` (as the default user) and returns their lines.
fn create_users(s: &Server) -> BTreeMap<String, Vec<String>> {
    let users = documented_users();
    let mut c = s.conn();
    for words in users.values() {
        let args: Vec<&str> = words.iter().map(String::as_str).collect();
        ok(&mut c, &args);
    }
    users
}

/// A connection authenticated as `user` with the password its documented line sets.
fn conn_as(s: &Server, users: &BTreeMap<String, Vec<String>>, user: &str) -> redis::Connection {
    let words = users
        .get(user)
        .unwrap_or_else(|| panic!("docs/operations.md has no ACL SETUSER {user}"));
    let password = words
        .iter()
        .find_map(|w| w.strip_prefix('>'))
        .unwrap_or_else(|| panic!("no >password for {user}"));
    let url = format!("redis://{user}:{password}@127.0.0.1:{}/", s.port);
    redis::Client::open(url).unwrap().get_connection().unwrap()
}

/// What a NOPERM refusal refused: the command itself, or one of its keys.
#[derive(Clone, Copy)]
enum Refused {
    Command,
    Key,
}
const NO_COMMAND: Refused = Refused::Command;
const NO_KEY: Refused = Refused::Key;

/// `args` fails with code NOPERM and the server's ACL LOG (read through `root`) records the
/// refusal of what `what` names: the command (`quota.set`, `config|set`) or one of its keys.
/// Checks the code and the log entry's fields, not a sentence: Redis 7.0 and Valkey 8 word
/// NOPERM messages differently.
fn assert_noperm(
    root: &mut redis::Connection,
    c: &mut redis::Connection,
    args: &[&str],
    what: Refused,
) {
    let (code, msg) = err(c, args);
    assert_eq!(code, "NOPERM", "{args:?}: {msg}");
    let name = args[0].to_lowercase();
    let command = match name.as_str() {
        "config" | "acl" | "client" => format!("{name}|{}", args[1].to_lowercase()),
        _ => name,
    };
    let reason = match what {
        Refused::Command => "command",
        Refused::Key => "key",
    };
    let log = items(&ok(root, &["ACL", "LOG", "1"]));
    assert_eq!(log.len(), 1, "{args:?}: no ACL LOG entry");
    let fields: BTreeMap<String, String> = items(&log[0])
        .chunks(2)
        .filter_map(|p| match &p[1] {
            Value::BulkString(_) | Value::SimpleString(_) => Some((text(&p[0]), text(&p[1]))),
            _ => None,
        })
        .collect();
    assert_eq!(fields["reason"], reason, "{args:?}: {fields:?}");
    let object = &fields["object"];
    match what {
        Refused::Command => {
            // Logged under its registered name (`QUOTA.SET`, `config|set`); both servers name
            // it in quotes in the message.
            assert_eq!(object.to_lowercase(), command, "{args:?}: {fields:?}");
            let quoted = format!("'{command}'");
            assert!(msg.to_lowercase().contains(&quoted), "{args:?}: {msg}");
        }
        Refused::Key => {
            // One of the command's keys (as the server finds them), outside the `~quota:*`
            // pattern of the documented users.
            let mut getkeys = vec!["COMMAND", "GETKEYS"];
            getkeys.extend_from_slice(args);
            let keys: Vec<String> = items(&ok(root, &getkeys)).iter().map(text).collect();
            assert!(keys.contains(object), "{args:?}: {object} not in {keys:?}");
            assert!(!object.starts_with("quota:"), "{args:?}: {fields:?}");
        }
    }
}

fn redis_version(c: &mut redis::Connection) -> (u32, u32) {
    let info: String = redis::cmd("INFO").arg("server").query(c).unwrap();
    let v = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap()
        .trim();
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap());
    (parts.next().unwrap(), parts.next().unwrap())
}

#[test]
fn the_documented_users_exist() {
    let users = documented_users();
    for name in ["quota-gateway", "quota-admin", "quota-metrics"] {
        assert!(users.contains_key(name), "docs/operations.md lacks {name}");
    }
}

#[test]
fn gateway_may_only_reserve_settle_rollback_extend_and_window_on_quota_keys() {
    let s = Server::start(&[]);
    let users = create_users(&s);
    let mut root = s.conn();
    ok(&mut root, &["QUOTA.SET", "quota:acme", "LIMIT", "1000"]);
    ok(&mut root, &["QUOTA.SET", "acme", "LIMIT", "1000"]);

    let mut g = conn_as(&s, &users, "quota-gateway");
    assert_eq!(ok(&mut g, &["PING"]), Value::SimpleString("PONG".into()));
    // Its commands, on its keys.
    let r = items(&ok(
        &mut g,
        &["QUOTA.RESERVE", "quota:acme", "100", "ID", "a"],
    ));
    assert_eq!(r[0], Value::Int(1));
    ok(&mut g, &["QUOTA.RESERVE", "quota:acme", "100", "ID", "b"]);
    ok(&mut g, &["QUOTA.EXTEND", "quota:acme", "a", "60000"]);
    let settled = items(&ok(&mut g, &["QUOTA.SETTLE", "quota:acme", "a", "42"]));
    assert_eq!(text(&settled[0]), "settled");
    let rolled = items(&ok(&mut g, &["QUOTA.ROLLBACK", "quota:acme", "b"]));
    assert_eq!(text(&rolled[0]), "rolledback");
    let w = items(&ok(
        &mut g,
        &["QUOTA.WINDOW", "quota:rpm:acme", "3", "60000"],
    ));
    assert_eq!(w[0], Value::Int(1));
    // The multi-key commands, on its keys: the ACL checks every key their key spec names.
    ok(
        &mut root,
        &["QUOTA.SET", "quota:tpm:acme", "WINDOW", "1000", "60000"],
    );
    let m = items(&ok(
        &mut g,
        &[
            "QUOTA.MRESERVE",
            "2",
            "quota:acme",
            "quota:tpm:acme",
            "10",
            "10",
            "ID",
            "m",
        ],
    ));
    assert_eq!(m[0], Value::Int(1));
    ok(
        &mut g,
        &[
            "QUOTA.MEXTEND",
            "2",
            "quota:acme",
            "quota:tpm:acme",
            "m",
            "1000",
        ],
    );
    ok(
        &mut g,
        &[
            "QUOTA.MSETTLE",
            "2",
            "quota:acme",
            "quota:tpm:acme",
            "m",
            "5",
            "5",
        ],
    );
    assert_noperm(
        &mut root,
        &mut g,
        &["QUOTA.MRESERVE", "2", "quota:acme", "acme", "1", "1"],
        NO_KEY,
    );
    assert_noperm(
        &mut root,
        &mut g,
        &["QUOTA.MROLLBACK", "2", "quota:acme", "acme", "m"],
        NO_KEY,
    );

    // Not its commands.
    for args in [
        vec!["QUOTA.SET", "quota:acme", "LIMIT", "1000000"],
        vec!["QUOTA.SET", "quota:new", "LIMIT", "5"],
        vec!["QUOTA.CHARGE", "quota:acme", "1"],
        vec!["QUOTA.INFO", "quota:acme"],
        vec!["QUOTA.PENDING", "quota:acme"],
        vec!["QUOTA.APPLY", "quota:acme", "1", "CHARGE", "1", "0"],
        vec!["QUOTA.LOAD", "quota:acme", "rq-budget", "2", "x"],
        vec![
            "QUOTA.WAPPLY",
            "quota:rpm:acme",
            "1",
            "60000",
            "1000",
            "1",
            "-1",
        ],
        vec!["DEL", "quota:acme"],
        vec!["GET", "quota:acme"],
        vec!["SET", "quota:acme", "x"],
        vec!["RENAME", "quota:acme", "quota:other"],
        vec!["KEYS", "*"],
        vec!["FLUSHALL"],
        vec!["CONFIG", "SET", "quota.max-pending", "1"],
    ] {
        assert_noperm(&mut root, &mut g, &args, NO_COMMAND);
    }
    // Not its keys.
    assert_noperm(&mut root, &mut g, &["QUOTA.RESERVE", "acme", "1"], NO_KEY);
    assert_noperm(
        &mut root,
        &mut g,
        &["QUOTA.SETTLE", "acme", "x", "1"],
        NO_KEY,
    );
    assert_noperm(&mut root, &mut g, &["QUOTA.ROLLBACK", "acme", "x"], NO_KEY);
    assert_noperm(
        &mut root,
        &mut g,
        &["QUOTA.EXTEND", "acme", "x", "1"],
        NO_KEY,
    );
    assert_noperm(
        &mut root,
        &mut g,
        &["QUOTA.WINDOW", "rpm:acme", "3", "60000"],
        NO_KEY,
    );

    // Nothing refused changed anything.
    let i = info(&mut root, "quota:acme");
    // 42 settled by SETTLE, 5 by MSETTLE.
    assert_eq!((i["limit"], i["used"], i["reserved"]), (1000, 47, 0));
    assert_eq!(info(&mut root, "acme")["reserved"], 0);
    assert_eq!(
        ok(&mut root, &["EXISTS", "quota:new", "rpm:acme"]),
        Value::Int(0)
    );
}

#[test]
fn admin_may_also_set_charge_and_read_but_only_quota_keys() {
    let s = Server::start(&[]);
    let users = create_users(&s);
    let mut root = s.conn();
    let mut a = conn_as(&s, &users, "quota-admin");
    assert_eq!(
        ok(&mut a, &["QUOTA.SET", "quota:acme", "LIMIT", "1000"]),
        Value::Int(1)
    );
    ok(
        &mut a,
        &["QUOTA.SET", "quota:acme", "LIMIT", "2000", "PERIOD", "DAY"],
    );
    ok(&mut a, &["QUOTA.RESERVE", "quota:acme", "10", "ID", "r"]);
    ok(&mut a, &["QUOTA.CHARGE", "quota:acme", "5"]);
    assert_eq!(
        items(&ok(&mut a, &["QUOTA.PENDING", "quota:acme"])).len(),
        1
    );
    ok(&mut a, &["QUOTA.SETTLE", "quota:acme", "r", "7"]);
    ok(
        &mut a,
        &[
            "QUOTA.WINDOW",
            "quota:tpm:acme",
            "50000",
            "60000",
            "COST",
            "100",
        ],
    );
    let i = info(&mut a, "quota:acme");
    assert_eq!((i["limit"], i["used"]), (2000, 12));

    assert_noperm(
        &mut root,
        &mut a,
        &["QUOTA.SET", "acme", "LIMIT", "1"],
        NO_KEY,
    );
    assert_noperm(&mut root, &mut a, &["QUOTA.INFO", "acme"], NO_KEY);
    for args in [
        vec!["DEL", "quota:acme"],
        vec!["CONFIG", "SET", "quota.test-clock", "yes"],
        vec!["QUOTA.APPLY", "quota:acme", "1", "CHARGE", "1", "0"],
        vec!["QUOTA.LOAD", "quota:acme", "rq-budget", "2", "x"],
        vec!["FLUSHALL"],
    ] {
        assert_noperm(&mut root, &mut a, &args, NO_COMMAND);
    }
}

/// On 7.0 module commands are in no category, so `+@write` does not grant them; from 7.2 the
/// module puts them in `@write`/`@read`, so it does (and never the internal ones).
#[test]
fn categories_grant_module_commands_only_from_redis_7_2() {
    let s = Server::start(&[]);
    let mut root = s.conn();
    ok(&mut root, &["QUOTA.SET", "quota:acme", "LIMIT", "1000"]);
    ok(
        &mut root,
        &[
            "ACL", "SETUSER", "writer", "on", ">pw", "~*", "-@all", "+@write", "+@read",
        ],
    );
    let url = format!("redis://writer:pw@127.0.0.1:{}/", s.port);
    let mut w = redis::Client::open(url).unwrap().get_connection().unwrap();
    let reserve = ["QUOTA.RESERVE", "quota:acme", "1"];
    if redis_version(&mut root) < (7, 2) {
        assert_noperm(&mut root, &mut w, &reserve, NO_COMMAND);
        assert_noperm(&mut root, &mut w, &["QUOTA.INFO", "quota:acme"], NO_COMMAND);
    } else {
        ok(&mut w, &reserve);
        ok(&mut w, &["QUOTA.INFO", "quota:acme"]);
    }
    // `+@all` grants them on every version; `-@dangerous` then takes the internal ones away
    // on 7.2+ (on 7.0 they refuse clients themselves).
    ok(
        &mut root,
        &[
            "ACL",
            "SETUSER",
            "all",
            "on",
            ">pw",
            "~*",
            "+@all",
            "-@dangerous",
        ],
    );
    let url = format!("redis://all:pw@127.0.0.1:{}/", s.port);
    let mut all = redis::Client::open(url).unwrap().get_connection().unwrap();
    ok(&mut all, &reserve);
    let (code, _) = err(
        &mut all,
        &["QUOTA.APPLY", "quota:acme", "1", "CHARGE", "1", "0"],
    );
    assert!(code == "NOPERM" || code == "ERR", "{code}");
}

/// The metrics user runs contrib/quota-info.lua as redis_exporter's `--script` would, and gets
/// every `INFO quota` field with its value.
#[test]
fn metrics_user_runs_the_exporter_script() {
    let s = Server::start(&[]);
    let users = create_users(&s);
    let mut root = s.conn();
    ok(&mut root, &["QUOTA.SET", "quota:acme", "LIMIT", "10"]);
    ok(&mut root, &["QUOTA.RESERVE", "quota:acme", "4"]);
    ok(&mut root, &["QUOTA.RESERVE", "quota:acme", "40"]);
    let script = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/contrib/quota-info.lua"
    ))
    .unwrap();
    let mut m = conn_as(&s, &users, "quota-metrics");
    // As the exporter calls it: EVAL script 0, a flat list of name, value.
    let flat: Vec<String> = redis::cmd("EVAL")
        .arg(&script)
        .arg(0)
        .query(&mut m)
        .unwrap();
    let got: BTreeMap<String, i64> = flat
        .chunks(2)
        .map(|p| (p[0].clone(), p[1].parse().unwrap()))
        .collect();
    let info: String = redis::cmd("INFO").arg("quota").query(&mut root).unwrap();
    let want: BTreeMap<String, i64> = info
        .lines()
        .filter_map(|l| l.trim().split_once(':'))
        .filter_map(|(k, v)| v.parse().ok().map(|v| (k.to_string(), v)))
        .collect();
    assert_eq!(got.len(), want.len(), "{got:?}");
    assert!(got.len() >= 20, "{got:?}");
    for (k, v) in &want {
        assert!(k.starts_with("quota_"), "{k}");
        if !k.starts_with("quota_sweeper") {
            assert_eq!(got.get(k), Some(v), "{k}");
        }
    }
    assert_eq!(got["quota_reserve_granted"], 1);
    assert_eq!(got["quota_reserve_denied"], 1);
    assert_eq!(got["quota_budget_keys"], 1);
    // The metrics user reads nothing else.
    assert_noperm(&mut root, &mut m, &["QUOTA.INFO", "quota:acme"], NO_COMMAND);
    assert_noperm(&mut root, &mut m, &["GET", "quota:acme"], NO_COMMAND);
}

#[test]
fn usage_exporter_user_consumes_streams_and_reads_budgets_only() {
    let s = Server::start(&[]);
    let users = create_users(&s);
    let mut root = s.conn();
    let mut admin = conn_as(&s, &users, "quota-admin");
    ok(
        &mut admin,
        &[
            "QUOTA.SET",
            "quota:b",
            "LIMIT",
            "10",
            "STREAM",
            "quota:usage",
        ],
    );
    ok(&mut admin, &["QUOTA.CHARGE", "quota:b", "3"]);
    let mut e = conn_as(&s, &users, "quota-export");
    ok(
        &mut e,
        &["XGROUP", "CREATE", "quota:usage", "g", "0", "MKSTREAM"],
    );
    let r = ok(
        &mut e,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "c",
            "STREAMS",
            "quota:usage",
            ">",
        ],
    );
    let id = text(&items(&items(&items(&items(&r)[0])[1])[0])[0]);
    ok(&mut e, &["XAUTOCLAIM", "quota:usage", "g", "c", "0", "0-0"]);
    ok(&mut e, &["XINFO", "GROUPS", "quota:usage"]);
    ok(&mut e, &["XINFO", "STREAM", "quota:usage"]);
    assert_eq!(int(&ok(&mut e, &["XACK", "quota:usage", "g", &id])), 1);
    ok(&mut e, &["QUOTA.INFO", "quota:b"]);
    assert_noperm(
        &mut root,
        &mut e,
        &["XADD", "quota:usage", "*", "a", "1"],
        NO_COMMAND,
    );
    assert_noperm(
        &mut root,
        &mut e,
        &["QUOTA.CHARGE", "quota:b", "1"],
        NO_COMMAND,
    );
    assert_noperm(&mut root, &mut e, &["XINFO", "GROUPS", "other"], NO_KEY);
}
