//! The commands document themselves: `COMMAND DOCS`, `COMMAND INFO`, `COMMAND GETKEYS` and
//! `QUOTA.HELP` for every `QUOTA.*` command, as set at load from src/shell/command_docs.rs.

mod common;
use common::*;

use std::collections::BTreeMap;

/// Every command the module registers, and whether it is internal.
const COMMANDS: &[(&str, bool)] = &[
    ("QUOTA.SET", false),
    ("QUOTA.INFO", false),
    ("QUOTA.RESERVE", false),
    ("QUOTA.SETTLE", false),
    ("QUOTA.ROLLBACK", false),
    ("QUOTA.EXTEND", false),
    ("QUOTA.CHARGE", false),
    ("QUOTA.PENDING", false),
    ("QUOTA.WINDOW", false),
    ("QUOTA.MRESERVE", false),
    ("QUOTA.MSETTLE", false),
    ("QUOTA.MROLLBACK", false),
    ("QUOTA.MEXTEND", false),
    ("QUOTA.HELP", false),
    ("QUOTA.APPLY", true),
    ("QUOTA.WAPPLY", true),
    ("QUOTA.MAPPLY", true),
    ("QUOTA.LOAD", true),
];

/// A RESP2 field/value array as a map.
fn fields(v: &Value) -> BTreeMap<String, Value> {
    let list = items(v);
    assert_eq!(list.len() % 2, 0, "{v:?}");
    list.chunks(2)
        .map(|kv| (text(&kv[0]), kv[1].clone()))
        .collect()
}

/// `COMMAND DOCS name` as a map (its one entry).
fn docs(c: &mut redis::Connection, name: &str) -> BTreeMap<String, Value> {
    let reply = items(&ok(c, &["COMMAND", "DOCS", name]));
    assert_eq!(reply.len(), 2, "{name}: {reply:?}");
    assert!(text(&reply[0]).eq_ignore_ascii_case(name));
    fields(&reply[1])
}

/// An argument of `COMMAND DOCS`: (name, type, token, flags, subarguments' names).
fn arg(v: &Value) -> (String, String, String, String, Vec<String>) {
    let f = fields(v);
    let get = |k: &str| f.get(k).map(text).unwrap_or_default();
    let flags = f
        .get("flags")
        .map(|v| items(v).iter().map(text).collect::<Vec<_>>().join(","))
        .unwrap_or_default();
    let subargs = f
        .get("arguments")
        .map(|v| items(v).iter().map(|a| arg(a).2).collect())
        .unwrap_or_default();
    (get("name"), get("type"), get("token"), flags, subargs)
}

#[test]
fn every_command_documents_itself() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let mut listed: Vec<String> = items(&ok(
        &mut c,
        &["COMMAND", "LIST", "FILTERBY", "MODULE", "quota"],
    ))
    .iter()
    .map(|v| text(v).to_ascii_uppercase())
    .collect();
    listed.sort();
    let mut want: Vec<String> = COMMANDS.iter().map(|(n, _)| n.to_string()).collect();
    want.sort();
    assert_eq!(
        listed, want,
        "a registered command without a row here (and docs?)"
    );
    for &(name, internal) in COMMANDS {
        let d = docs(&mut c, name);
        let summary = text(&d["summary"]);
        assert!(summary.len() > 20, "{name}: {summary}");
        assert_eq!(
            summary.starts_with("Internal, not for clients"),
            internal,
            "{name}: {summary}"
        );
        assert_eq!(text(&d["since"]), "0.1.0", "{name}");
        assert!(text(&d["complexity"]).starts_with("O("), "{name}");
        assert_eq!(text(&d["group"]), "module", "{name}");
        assert_eq!(text(&d["module"]), "quota", "{name}");
        if name == "QUOTA.HELP" {
            assert!(!d.contains_key("arguments"), "{name}");
            continue;
        }
        // Every other command's first argument is its key, at key spec 0 (after numkeys for
        // the multi-key commands).
        let args = items(&d["arguments"]);
        let first = fields(&args[usize::from(name.starts_with("QUOTA.M"))]);
        assert_eq!(text(&first["name"]), "key", "{name}");
        assert_eq!(text(&first["type"]), "key", "{name}");
        assert_eq!(first["key_spec_index"], Value::Int(0), "{name}");
    }
}

#[test]
fn arguments_carry_type_token_and_flags() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let args = |c: &mut redis::Connection, name: &str| -> Vec<_> {
        items(&docs(c, name)["arguments"]).iter().map(arg).collect()
    };
    let a =
        |n: &str, t: &str, tok: &str, f: &str| (n.into(), t.into(), tok.into(), f.into(), vec![]);
    let at = a("unix_ms", "unix-time", "AT", "optional");
    assert_eq!(
        args(&mut c, "quota.reserve"),
        vec![
            a("key", "key", "", ""),
            a("amount", "integer", "", ""),
            a("id", "string", "ID", "optional"),
            a("ttl_ms", "integer", "TTL", "optional"),
            a("keep", "integer", "KEEP", "optional"),
            at.clone(),
        ]
    );
    assert_eq!(
        args(&mut c, "QUOTA.CHARGE"),
        vec![
            a("key", "key", "", ""),
            a("amount", "integer", "", ""),
            a("id", "string", "ID", "optional"),
            a("force", "pure-token", "FORCE", "optional"),
            a("keep", "integer", "KEEP", "optional"),
            at.clone(),
        ]
    );
    let set = args(&mut c, "QUOTA.SET");
    let period = set.iter().find(|x| x.0 == "period").unwrap();
    assert_eq!(
        (period.1.as_str(), period.2.as_str(), period.3.as_str()),
        ("oneof", "PERIOD", "optional")
    );
    assert_eq!(period.4, ["NONE", "MINUTE", "HOUR", "DAY", "WEEK", "MONTH"]);
    let condition = set.iter().find(|x| x.0 == "condition").unwrap();
    assert_eq!(
        (condition.1.as_str(), condition.3.as_str()),
        ("oneof", "optional")
    );
    assert_eq!(condition.4, ["NX", "XX"]);
    let tokens: Vec<&str> = set.iter().map(|x| x.2.as_str()).collect();
    assert_eq!(
        tokens,
        [
            "",
            "WINDOW",
            "LIMIT",
            "USED",
            "OVERDRAFT",
            "MAXRESERVE",
            "TTL",
            "PERIOD",
            "TZ",
            "ANCHOR",
            "ONEXPIRE",
            "UNIT",
            "STREAM",
            "STREAMMAXLEN",
            "",
            "AT"
        ]
    );
    assert_eq!(
        args(&mut c, "QUOTA.WINDOW"),
        vec![
            a("key", "key", "", ""),
            (
                "window".into(),
                "block".into(),
                "".into(),
                "optional".into(),
                vec!["".into(), "".into()]
            ),
            a("cost", "integer", "COST", "optional"),
            a("precision_ms", "integer", "PRECISION", "optional"),
            a("peek", "pure-token", "PEEK", "optional"),
            at.clone(),
        ]
    );
    let window = set.iter().find(|x| x.0 == "window").unwrap();
    assert_eq!(
        (window.1.as_str(), window.2.as_str(), window.3.as_str()),
        ("block", "WINDOW", "optional")
    );
    assert_eq!(window.4, ["", "", "PRECISION"]);
    assert_eq!(
        args(&mut c, "QUOTA.MRESERVE"),
        vec![
            a("numkeys", "integer", "", ""),
            a("key", "key", "", "multiple"),
            a("amount", "integer", "", "multiple"),
            a("id", "string", "ID", "optional"),
            a("ttl_ms", "integer", "TTL", "optional"),
            a("keep", "integer", "KEEP", "optional"),
            at.clone(),
        ]
    );
    // SETTLE's third argument: an integer or the word ELAPSED (a time budget).
    let settle = args(&mut c, "QUOTA.SETTLE");
    assert_eq!(
        (
            settle[2].0.as_str(),
            settle[2].1.as_str(),
            settle[2].3.as_str()
        ),
        ("actual", "oneof", "")
    );
    assert_eq!(settle[2].4, ["", "ELAPSED"]);
    let apply = args(&mut c, "QUOTA.APPLY");
    assert_eq!(apply[2].3, "optional,multiple");
}

/// Arity, flags, legacy key positions and key specs (`COMMAND INFO`), and the key found by
/// `COMMAND GETKEYS` for a call of each command.
#[test]
fn command_info_and_getkeys_for_every_command() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // Single-key commands: legacy key positions (1, 1, 1) and one range key spec at 1. The
    // multi-key commands (keys a and b in the call): no legacy key positions, one keynum key
    // spec (numkeys at 1).
    // (name, arity, a call's arguments after the name, the key spec's flags)
    let cases: &[(&str, i64, &[&str], &[&str])] = &[
        ("QUOTA.SET", -2, &["k", "LIMIT", "5"], &["RW", "update"]),
        ("QUOTA.INFO", -2, &["k"], &["RO", "access"]),
        (
            "QUOTA.RESERVE",
            -2,
            &["k", "5", "TTL", "10"],
            &["RW", "access", "update"],
        ),
        (
            "QUOTA.SETTLE",
            -2,
            &["k", "id", "5"],
            &["RW", "access", "update"],
        ),
        (
            "QUOTA.ROLLBACK",
            -2,
            &["k", "id"],
            &["RW", "access", "update"],
        ),
        ("QUOTA.EXTEND", -2, &["k", "id", "100"], &["RW", "update"]),
        (
            "QUOTA.CHARGE",
            -2,
            &["k", "5", "FORCE"],
            &["RW", "access", "update"],
        ),
        ("QUOTA.PENDING", -2, &["k", "COUNT", "5"], &["RO", "access"]),
        (
            "QUOTA.WINDOW",
            -2,
            &["k", "10", "1000", "PEEK"],
            &["RW", "access", "update"],
        ),
        ("QUOTA.APPLY", -3, &["k", "1 CHARGE 1 0"], &["RW", "update"]),
        (
            "QUOTA.WAPPLY",
            -3,
            &["k", "1 1000 10 1 2000"],
            &["RW", "update"],
        ),
        (
            "QUOTA.LOAD",
            -4,
            &["k", "rq-budget", "2", "x"],
            &["OW", "update"],
        ),
        (
            "QUOTA.MRESERVE",
            -2,
            &["2", "a", "b", "1", "1"],
            &["RW", "access", "update"],
        ),
        (
            "QUOTA.MSETTLE",
            -2,
            &["2", "a", "b", "id", "1", "1"],
            &["RW", "access", "update"],
        ),
        (
            "QUOTA.MROLLBACK",
            -2,
            &["2", "a", "b", "id"],
            &["RW", "access", "update"],
        ),
        (
            "QUOTA.MEXTEND",
            -2,
            &["2", "a", "b", "id", "100"],
            &["RW", "update"],
        ),
    ];
    for &(name, arity, call, flags) in cases {
        let multi = call[0] == "2";
        let info = items(&ok(&mut c, &["COMMAND", "INFO", name]));
        let info = items(&info[0]);
        assert!(text(&info[0]).eq_ignore_ascii_case(name));
        assert_eq!(info[1], Value::Int(arity), "{name} arity");
        assert_eq!(
            (int(&info[3]), int(&info[4]), int(&info[5])),
            if multi { (0, 0, 0) } else { (1, 1, 1) },
            "{name} key positions"
        );
        let specs = items(&info[8]);
        assert_eq!(specs.len(), 1, "{name}");
        let spec = fields(&specs[0]);
        let got: Vec<String> = items(&spec["flags"]).iter().map(text).collect();
        assert_eq!(got, flags, "{name} key spec flags");
        let begin = fields(&spec["begin_search"]);
        assert_eq!(text(&begin["type"]), "index", "{name}");
        assert_eq!(fields(&begin["spec"])["index"], Value::Int(1), "{name}");
        let find = fields(&spec["find_keys"]);
        let (kind, names, want, keys) = if multi {
            (
                "keynum",
                ["keynumidx", "firstkey", "keystep"],
                [0, 1, 1],
                &["a", "b"][..],
            )
        } else {
            (
                "range",
                ["lastkey", "keystep", "limit"],
                [0, 1, 0],
                &["k"][..],
            )
        };
        assert_eq!(text(&find["type"]), kind, "{name}");
        let find_spec = fields(&find["spec"]);
        assert_eq!(names.map(|n| int(&find_spec[n])), want, "{name}");

        let mut getkeys = vec!["COMMAND", "GETKEYS", name];
        getkeys.extend_from_slice(call);
        let got: Vec<String> = items(&ok(&mut c, &getkeys)).iter().map(text).collect();
        assert_eq!(got, keys, "{name}");
    }
    // QUOTA.HELP: no keys, exactly its name.
    let info = items(&items(&ok(&mut c, &["COMMAND", "INFO", "QUOTA.HELP"]))[0]);
    assert_eq!(info[1], Value::Int(1));
    assert_eq!((int(&info[3]), int(&info[4]), int(&info[5])), (0, 0, 0));
    assert!(items(&info[8]).is_empty());
    let (code, _) = err(&mut c, &["COMMAND", "GETKEYS", "QUOTA.HELP"]);
    assert_eq!(code, "ERR");
}

/// `QUOTA.HELP` answers as `XINFO HELP` does (an array of simple strings, a header line
/// first), then one line per command: its usage and summary (QUOTA.SET: two, one per form).
/// A client command's arity error ends with the same usage.
#[test]
fn help_lists_every_command_like_xinfo_help() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let xinfo = ok(&mut c, &["XINFO", "HELP"]);
    let help = ok(&mut c, &["QUOTA.HELP"]);
    let simple = |v: &Value| items(v).iter().all(|l| matches!(l, Value::SimpleString(_)));
    assert!(simple(&xinfo) && simple(&help), "{help:?}");
    let mut lines: Vec<String> = items(&help).iter().map(text).collect();
    assert_eq!(
        lines[0],
        "QUOTA.<command> [<arg> ...]: a key first, numkeys key [key ...] first for QUOTA.M*, \
         nothing for QUOTA.HELP. Commands are:"
    );
    // QUOTA.SET's second form: a window key's configuration, with nothing of a budget's.
    let window_form = lines.remove(2);
    assert_eq!(
        window_form,
        "QUOTA.SET key WINDOW limit window_ms [PRECISION precision_ms] [NX|XX] [AT unix_ms] -- \
         Stores a window key's configuration (no other option but NX, XX, AT); QUOTA.WINDOW key \
         and the M* commands then use it."
    );
    assert!(
        lines[1].starts_with("QUOTA.SET key [LIMIT limit] ") && !lines[1].contains("WINDOW limit"),
        "{}",
        lines[1]
    );
    assert!(lines[2].contains("or a window key's"), "{}", lines[2]);
    assert_eq!(lines.len(), COMMANDS.len() + 1, "{lines:#?}");
    for (&(name, internal), line) in COMMANDS.iter().zip(&lines[1..]) {
        assert!(
            line.starts_with(&format!("{name} ")) || line.starts_with(&format!("{name} --")),
            "{line}"
        );
        let (usage, summary) = line.split_once(" -- ").unwrap();
        let d = docs(&mut c, name);
        assert_eq!(summary, text(&d["summary"]), "{name}");
        // Internal commands declare their true arity: Redis answers for them.
        if internal
            || name == "QUOTA.HELP"
            || name == "QUOTA.INFO"
            || name == "QUOTA.SET"
            || name == "QUOTA.PENDING"
            || name == "QUOTA.WINDOW"
            || name.starts_with("QUOTA.M")
        {
            continue;
        }
        // Too few arguments (the key alone): the arity error carries the usage line.
        let (code, msg) = err(&mut c, &[name, "k"]);
        assert_eq!(code, "ERR", "{name}");
        assert!(
            msg.ends_with(&format!(
                "wrong number of arguments for '{name}' command. Usage: {usage}"
            )),
            "{name}: {msg}"
        );
    }
    assert_eq!(
        lines[3],
        "QUOTA.RESERVE key amount [ID id] [TTL ttl_ms] [KEEP keep] [AT unix_ms] -- Reserves an amount \
         before the work: granted with the reservation's id, or denied with retry_after_ms. \
         Settle or roll back by id."
    );
    // Extra arguments are Redis's own arity error.
    let (code, msg) = err(&mut c, &["QUOTA.HELP", "RESERVE"]);
    assert_eq!(code, "ERR");
    assert!(msg.contains("wrong number of arguments"), "{msg}");
}
