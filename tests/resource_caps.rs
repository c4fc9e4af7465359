//! Resource caps (issue 6, item 5): one tenant cannot exhaust the server. Pending reservations
//! per key, id length, PENDING's COUNT, the work one command and one sweeper tick may do,
//! MEMORY USAGE that tells the truth for large keys, and `maxmemory` + `noeviction`.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn stats(c: &mut redis::Connection) -> BTreeMap<String, i64> {
    info_section(c, "quota")
}

/// Sends `n` commands built by `make` in pipelined batches; every reply must be a success.
fn pipelined(c: &mut redis::Connection, n: usize, make: impl Fn(usize) -> Vec<String>) {
    let mut i = 0;
    while i < n {
        let end = (i + 2000).min(n);
        let mut pipe = redis::pipe();
        for j in i..end {
            let args = make(j);
            let cmd = pipe.cmd(&args[0]);
            for a in &args[1..] {
                cmd.arg(a);
            }
        }
        let replies: Vec<Value> = pipe
            .query(c)
            .unwrap_or_else(|e| panic!("batch at {i}: {e}"));
        assert_eq!(replies.len(), end - i);
        i = end;
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// A 36-byte id in increasing order, as a gateway with time-ordered ids (UUIDv7) would send.
fn uuid(i: usize) -> String {
    format!(
        "{:08x}-7d3c-4b1e-9a2f-{:012x}",
        i,
        i.wrapping_mul(2_654_435_761)
    )
}

/// A 36-byte id in scattered order, as a gateway with random ids (UUIDv4) would send.
fn random_id(i: usize) -> String {
    let h = (i as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .rotate_left(29);
    format!("{:016x}-{:019x}", h, h.wrapping_mul(31) >> 1)
}

#[test]
fn max_pending_per_key_answers_limit() {
    // Sweeper off: it runs on the wall clock, far past these AT times.
    let s = Server::start_with_module_args(
        &[],
        &[
            "max-pending",
            "1000",
            "test-clock",
            "yes",
            "sweep-effort",
            "0",
        ],
    );
    let mut c = s.conn();
    // Created at AT 1000: a key's clock never goes back, so each call below runs at its AT.
    let set = [
        "QUOTA.SET",
        "t",
        "LIMIT",
        "1000000",
        "TTL",
        "10000",
        "AT",
        "1000",
    ];
    ok(&mut c, &set);
    pipelined(&mut c, 1000, |i| {
        args(&[
            "QUOTA.RESERVE",
            "t",
            "1",
            "ID",
            &format!("r{i}"),
            "AT",
            "1000",
        ])
    });
    let (code, msg) = err(&mut c, &["QUOTA.RESERVE", "t", "1", "AT", "1000"]);
    assert_eq!(code, "LIMIT");
    assert!(msg.contains("max 1000"), "{msg}");
    // Nothing was granted by the refusal; a retry of a pending id is still answered.
    assert_eq!(info_at(&mut c, "t", 1000)["pending"], 1000);
    let retry = ok(
        &mut c,
        &["QUOTA.RESERVE", "t", "1", "ID", "r7", "AT", "1000"],
    );
    assert_eq!(text(&items(&retry)[1]), "r7");
    // The cap is per key: another tenant is not affected.
    ok(&mut c, &["QUOTA.SET", "u", "LIMIT", "10", "AT", "1000"]);
    ok(&mut c, &["QUOTA.RESERVE", "u", "1", "AT", "1000"]);
    // Finishing one frees a slot.
    ok(&mut c, &["QUOTA.SETTLE", "t", "r0", "1", "AT", "1000"]);
    ok(
        &mut c,
        &["QUOTA.RESERVE", "t", "1", "ID", "x", "AT", "1000"],
    );
    let again = ["QUOTA.RESERVE", "t", "1", "AT", "1000"];
    assert_eq!(err(&mut c, &again).0, "LIMIT");
    // Expired reservations do not count, whether or not they were released yet.
    ok(
        &mut c,
        &["QUOTA.RESERVE", "t", "1", "ID", "y", "AT", "11001"],
    );
    // Lowering the cap below what a key holds refuses new reservations, keeps the old ones.
    ok(&mut c, &["CONFIG", "SET", "quota.max-pending", "1"]);
    let (code, _) = err(&mut c, &["QUOTA.RESERVE", "u", "1", "AT", "1000"]);
    assert_eq!(code, "LIMIT");
    assert_eq!(info_at(&mut c, "u", 1000)["pending"], 1);
}

#[test]
fn ids_longer_than_max_id_length_are_refused_everywhere() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "1000"]);
    let longest = "i".repeat(128);
    let too_long = "i".repeat(129);
    ok(&mut c, &["QUOTA.RESERVE", "t", "1", "ID", &longest]);
    // New ids are held to quota.max-id-length.
    for cmd in [
        vec!["QUOTA.RESERVE", "t", "1", "ID", &too_long],
        vec!["QUOTA.CHARGE", "t", "1", "ID", &too_long],
    ] {
        let (code, msg) = err(&mut c, &cmd);
        assert_eq!(code, "ERR", "{cmd:?}");
        assert!(msg.contains("longer than 128 bytes"), "{msg}");
    }
    // Existing ids only to the hard cap (64 KiB): lowering the config never strands a
    // reservation made under a higher one. This one was never made.
    for cmd in [
        vec!["QUOTA.SETTLE", "t", &too_long, "1"],
        vec!["QUOTA.ROLLBACK", "t", &too_long],
        vec!["QUOTA.EXTEND", "t", &too_long, "1000"],
    ] {
        assert_eq!(err(&mut c, &cmd).0, "NORESERVATION", "{cmd:?}");
    }
    let beyond_hard_cap = "i".repeat(65537);
    let (code, msg) = err(&mut c, &["QUOTA.SETTLE", "t", &beyond_hard_cap, "1"]);
    assert_eq!(code, "ERR");
    assert!(msg.contains("longer than 65536 bytes"), "{msg}");
    let i = info(&mut c, "t");
    assert_eq!((i["pending"], i["used"], i["reserved"]), (1, 0, 1));
    // The config is bounded too: at most 64 KiB.
    let (code, _) = err(&mut c, &["CONFIG", "SET", "quota.max-id-length", "65537"]);
    assert_eq!(code, "ERR");
    ok(&mut c, &["CONFIG", "SET", "quota.max-id-length", "65536"]);
    ok(
        &mut c,
        &["QUOTA.RESERVE", "t", "1", "ID", &"j".repeat(65536)],
    );
    let (code, _) = err(
        &mut c,
        &["QUOTA.RESERVE", "t", "1", "ID", &"j".repeat(65537)],
    );
    assert_eq!(code, "ERR");
    // Lowering the config keeps retries answered: a known id of any length up to the cap gets
    // its remembered reply (was `ERR id is longer than 4 bytes`); a new long one is refused.
    ok(&mut c, &["QUOTA.CHARGE", "t", "5", "ID", "charge-1"]);
    let before = info(&mut c, "t");
    ok(&mut c, &["CONFIG", "SET", "quota.max-id-length", "4"]);
    let retry = ok(&mut c, &["QUOTA.CHARGE", "t", "5", "ID", "charge-1"]);
    assert_eq!(items(&retry)[0], Value::Int(1), "{retry:?}");
    let again = ok(&mut c, &["QUOTA.RESERVE", "t", "1", "ID", &longest]);
    assert_eq!(items(&again)[0], Value::Int(1), "{again:?}");
    let after = info(&mut c, "t");
    assert_eq!(
        (after["used"], after["reserved"]),
        (before["used"], before["reserved"])
    );
    for cmd in [
        vec!["QUOTA.RESERVE", "t", "1", "ID", "new-1"],
        vec!["QUOTA.CHARGE", "t", "1", "ID", "new-2"],
    ] {
        let (code, msg) = err(&mut c, &cmd);
        assert_eq!(code, "ERR", "{cmd:?}");
        assert!(msg.contains("longer than 4 bytes"), "{msg}");
    }
}

#[test]
fn pending_returns_at_most_10000_entries() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "1000000"]);
    pipelined(&mut c, 10_050, |_| args(&["QUOTA.RESERVE", "t", "1"]));
    assert_eq!(info(&mut c, "t")["pending"], 10_050);
    assert_eq!(items(&ok(&mut c, &["QUOTA.PENDING", "t"])).len(), 100);
    let all = items(&ok(&mut c, &["QUOTA.PENDING", "t", "COUNT", "10000"]));
    assert_eq!(all.len(), 10_000);
    let (code, msg) = err(&mut c, &["QUOTA.PENDING", "t", "COUNT", "10001"]);
    assert_eq!(code, "ERR");
    assert!(msg.contains("between 0 and 10000"), "{msg}");
}

/// 100 000 expired reservations that nobody has released (sweeper off): each write releases
/// at most one maintenance batch (64) of them, while every read and decision sees them all as
/// released at once. Then the sweeper, turned on, releases at most `sweep-effort` per tick.
#[test]
fn work_per_command_and_per_sweeper_tick_is_bounded() {
    const N: usize = 100_000;
    const BATCH: i64 = 64;
    let s = Server::start_with_module_args(&[], &["test-clock", "yes", "sweep-effort", "0"]);
    let mut c = s.conn();
    ok(
        &mut c,
        &["QUOTA.SET", "big", "LIMIT", "1000000000", "AT", "1000"],
    );
    pipelined(&mut c, N, |_| {
        args(&["QUOTA.RESERVE", "big", "1", "TTL", "1000", "AT", "1000"])
    });
    let before = stats(&mut c);
    assert_eq!(before["quota_pending_reservations"], N as i64);
    // Reads see every one of them released, with nothing written.
    let v = info_at(&mut c, "big", 5000);
    assert_eq!((v["reserved"], v["pending"]), (0, 0));
    assert_eq!(stats(&mut c)["quota_pending_reservations"], N as i64);

    let mut pending = N as i64;
    let mut expired = before["quota_expired"];
    let mut slowest = Duration::ZERO;
    for round in 0..20 {
        let id = format!("n{round}");
        let cmd = if round % 2 == 0 {
            vec!["QUOTA.RESERVE", "big", "5", "ID", &id, "AT", "5000"]
        } else {
            vec!["QUOTA.CHARGE", "big", "5", "AT", "5000"]
        };
        let t = Instant::now();
        ok(&mut c, &cmd);
        slowest = slowest.max(t.elapsed());
        let now = stats(&mut c);
        let released = now["quota_expired"] - expired;
        assert_eq!(
            released, BATCH,
            "round {round}: one write releases one batch"
        );
        let granted = i64::from(round % 2 == 0);
        assert_eq!(now["quota_pending_reservations"], pending - BATCH + granted);
        pending = now["quota_pending_reservations"];
        expired = now["quota_expired"];
    }
    eprintln!("slowest write with ~100k unreleased expired reservations: {slowest:?}");
    // Decisions were exact all along: only the 10 new reservations and 10 charges count.
    let v = info_at(&mut c, "big", 5000);
    assert_eq!((v["reserved"], v["used"], v["pending"]), (50, 50, 10));

    // The sweeper, turned on: never more than sweep-effort releases per tick.
    const EFFORT: i64 = 2000;
    let start = stats(&mut c);
    let backlog = start["quota_pending_reservations"];
    ok(
        &mut c,
        &["CONFIG", "SET", "quota.sweep-effort", &EFFORT.to_string()],
    );
    let mut last = stats(&mut c);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut samples_with_releases = 0;
    while last["quota_pending_reservations"] > 0 {
        assert!(Instant::now() < deadline, "sweeper too slow: {last:?}");
        std::thread::sleep(Duration::from_millis(20));
        let now = stats(&mut c);
        let runs = now["quota_sweeper_runs"] - last["quota_sweeper_runs"];
        let released = now["quota_sweeper_released"] - last["quota_sweeper_released"];
        assert!(
            released <= EFFORT * runs,
            "{released} released in {runs} ticks (effort {EFFORT})"
        );
        if released > 0 {
            samples_with_releases += 1;
        }
        last = now;
    }
    // Catch-up ticks come 1 ms apart while keys are due, so the drain takes well under a
    // second, yet it took at least N / EFFORT = 50 ticks, and every sample kept the bound.
    let runs = last["quota_sweeper_runs"] - start["quota_sweeper_runs"];
    let released = last["quota_sweeper_released"] - start["quota_sweeper_released"];
    assert_eq!(released, backlog);
    assert!(backlog > 90_000, "{backlog}");
    assert!(
        runs >= backlog / EFFORT,
        "{released} released in {runs} ticks"
    );
    assert!(
        samples_with_releases >= 2,
        "{samples_with_releases} samples"
    );
    assert_eq!(stats(&mut c)["quota_expired"], N as i64 + 10);
}

/// Forgetting finished ids counts against `sweep-effort` too: 40 000 ids past `finished-ttl`
/// in 200 keys are forgotten over many ticks, none above the effort (a tick once forgot a
/// key's ids up to the whole effort while counting the key as one unit: all 40 000 in one
/// tick, blocking the server for seconds at larger sizes).
#[test]
fn a_sweeper_tick_bounds_its_forgets_too() {
    const KEYS: usize = 200;
    const IDS: usize = 40_000;
    const EFFORT: i64 = 500;
    let s = Server::start_with_module_args(&[], &["test-clock", "yes", "sweep-effort", "0"]);
    let mut c = s.conn();
    pipelined(&mut c, KEYS, |k| {
        args(&[
            "QUOTA.SET",
            &format!("k{k}"),
            "LIMIT",
            "1000000000",
            "AT",
            "1000",
        ])
    });
    // Charged at AT 1000 (1970): an hour's finished-ttl has long passed by the wall clock the
    // sweeper reads, so every id is due at once.
    pipelined(&mut c, IDS, |i| {
        let (key, id) = (format!("k{}", i % KEYS), format!("c{i}"));
        args(&["QUOTA.CHARGE", &key, "1", "ID", &id, "AT", "1000"])
    });
    let start = stats(&mut c);
    assert_eq!(start["quota_remembered_ids"], IDS as i64);
    ok(
        &mut c,
        &["CONFIG", "SET", "quota.sweep-effort", &EFFORT.to_string()],
    );
    let mut last = start.clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    while last["quota_remembered_ids"] > 0 {
        assert!(Instant::now() < deadline, "sweeper too slow: {last:?}");
        std::thread::sleep(Duration::from_millis(5));
        let now = stats(&mut c);
        let runs = now["quota_sweeper_runs"] - last["quota_sweeper_runs"];
        let forgotten = last["quota_remembered_ids"] - now["quota_remembered_ids"];
        assert!(
            forgotten <= EFFORT * runs,
            "{forgotten} forgotten in {runs} ticks (effort {EFFORT})"
        );
        last = now;
    }
    let runs = last["quota_sweeper_runs"] - start["quota_sweeper_runs"];
    assert!(
        runs >= IDS as i64 / EFFORT,
        "{IDS} forgotten in {runs} ticks"
    );
}

/// MEMORY USAGE of values against what deleting them gives back to the allocator. Measured on
/// a fresh connection after closing `c`: the buffers of a pipelining client would otherwise be
/// shrunk by Redis's client cron at any moment, moving `used_memory` by tens of KB.
fn reported_and_freed(s: &Server, c: redis::Connection, keys: &[String]) -> (i64, i64) {
    drop(c);
    std::thread::sleep(Duration::from_millis(50));
    let c = &mut s.conn();
    // A new connection's first commands grow its buffers (about 25 KB each, twice): wait until
    // used_memory stands still before measuring.
    settled_used_memory(c);
    let mut reported = 0;
    for k in keys {
        reported += int(&ok(c, &["MEMORY", "USAGE", k]));
    }
    let before = used_memory(c);
    let mut del = redis::cmd("DEL");
    for k in keys {
        del.arg(k);
    }
    let n: i64 = del.query(c).unwrap();
    assert_eq!(n, keys.len() as i64);
    let after = used_memory(c);
    (reported, before - after)
}

fn assert_within_10_percent(what: &str, reported: i64, freed: i64) {
    let ratio = reported as f64 / freed as f64;
    eprintln!("{what}: MEMORY USAGE {reported} B, freed by DEL {freed} B, ratio {ratio:.3}");
    assert!(
        (0.9..=1.1).contains(&ratio),
        "{what}: MEMORY USAGE {reported} vs real {freed} (ratio {ratio:.3})"
    );
}

/// Budgets of 100 000 ids each — 50 000 pending reservations and 50 000 remembered finished
/// ids, or all pending — with time-ordered, random and module-generated ids.
#[test]
fn memory_usage_of_large_budgets_is_within_10_percent() {
    let s = Server::start(&[]);
    type Case = (&'static str, fn(usize) -> String, bool);
    let cases: [Case; 4] = [
        ("quota:ordered", uuid, true),
        ("quota:random", random_id, true),
        ("quota:random-pending", random_id, false),
        ("quota:generated", |_| String::new(), true),
    ];
    for (key, id, finish_half) in cases {
        let mut c = s.conn();
        ok(&mut c, &["QUOTA.SET", key, "LIMIT", "1000000000"]);
        let ids: Vec<String> = if key == "quota:generated" {
            let mut ids = Vec::new();
            for _ in 0..50 {
                let mut pipe = redis::pipe();
                for _ in 0..2000 {
                    pipe.cmd("QUOTA.RESERVE").arg(key).arg(7);
                }
                let replies: Vec<Value> = pipe.query(&mut c).unwrap();
                ids.extend(replies.iter().map(|r| text(&items(r)[1])));
            }
            ids
        } else {
            pipelined(&mut c, 100_000, |i| {
                args(&["QUOTA.RESERVE", key, "7", "ID", &id(i)])
            });
            (0..100_000).map(id).collect()
        };
        if finish_half {
            // Every other one settled: finished ids interleave with pending ones.
            pipelined(&mut c, 50_000, |i| {
                args(&["QUOTA.SETTLE", key, &ids[2 * i], "5"])
            });
        }
        let i = info(&mut c, key);
        let want = if finish_half { 50_000 } else { 100_000 };
        assert_eq!(i["pending"], want, "{key}");
        let (reported, freed) = reported_and_freed(&s, c, &[key.to_string()]);
        assert_within_10_percent(key, reported, freed);
    }
}

#[test]
fn memory_usage_of_full_windows_is_within_10_percent() {
    let s = Server::start_with_module_args(&[], &["test-clock", "yes"]);
    let mut c = s.conn();
    // A time well in the future of the wall clock, so the keys do not expire meanwhile.
    let t0: i64 = {
        let (secs, _): (i64, i64) = redis::cmd("TIME").query(&mut c).unwrap();
        (secs + 3600) * 1000
    };
    // 20 windows of 4096 buckets each: PRECISION 1, one call per ms over a 4096 ms window.
    let keys: Vec<String> = (0..20).map(|k| format!("quota:w{k}")).collect();
    for k in &keys {
        pipelined(&mut c, 4096, |t| {
            let at = (t0 + t as i64).to_string();
            args(&[
                "QUOTA.WINDOW",
                k,
                "1000000000",
                "4096",
                "PRECISION",
                "1",
                "AT",
                &at,
            ])
        });
    }
    let (reported, freed) = reported_and_freed(&s, c, &keys);
    assert_within_10_percent("20 windows x 4096 buckets", reported, freed);
}

/// With `maxmemory` reached and `noeviction`, the commands that may grow memory (flagged
/// deny-oom) are refused with OOM; SETTLE and ROLLBACK (which free memory) still work.
#[test]
fn maxmemory_noeviction_refuses_growth_but_settles() {
    let s = Server::start(&["--maxmemory-policy", "noeviction"]);
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "quota:t", "LIMIT", "1000000000"]);
    ok(&mut c, &["QUOTA.RESERVE", "quota:t", "10", "ID", "a"]);
    ok(&mut c, &["QUOTA.RESERVE", "quota:t", "10", "ID", "b"]);
    // Fill up to a limit a little above what is used now.
    let limit = used_memory(&mut c) + 2_000_000;
    ok(&mut c, &["CONFIG", "SET", "maxmemory", &limit.to_string()]);
    let mut granted = 0;
    let oom = loop {
        match q(
            &mut c,
            &["QUOTA.RESERVE", "quota:t", "1", "ID", &uuid(granted)],
        ) {
            Ok(_) => granted += 1,
            Err(e) => break e,
        }
        assert!(granted < 1_000_000, "never reached maxmemory");
    };
    assert_eq!(oom.code(), Some("OOM"), "{oom}");
    assert!(granted > 1000, "only {granted} reservations fit in 2 MB");
    // The first refusal may come a few bytes past the limit, and the client's buffers freed
    // after it can take used_memory back below: put the limit clearly under what is used, so
    // every growth below is refused whatever the allocation that crossed it.
    let below = used_memory(&mut c) - 64 * 1024;
    ok(&mut c, &["CONFIG", "SET", "maxmemory", &below.to_string()]);
    for cmd in [
        vec!["QUOTA.RESERVE", "quota:t", "1"],
        vec!["QUOTA.CHARGE", "quota:t", "1"],
        vec!["QUOTA.SET", "quota:t", "LIMIT", "5"],
        vec!["QUOTA.SET", "quota:new", "LIMIT", "5"],
        vec!["QUOTA.WINDOW", "quota:rpm", "10", "60000"],
    ] {
        assert_eq!(err(&mut c, &cmd).0, "OOM", "{cmd:?}");
    }
    let before = info(&mut c, "quota:t");
    let settled = items(&ok(&mut c, &["QUOTA.SETTLE", "quota:t", "a", "7"]));
    assert_eq!(text(&settled[0]), "settled");
    let rolled = items(&ok(&mut c, &["QUOTA.ROLLBACK", "quota:t", "b"]));
    assert_eq!(text(&rolled[0]), "rolledback");
    ok(&mut c, &["QUOTA.EXTEND", "quota:t", &uuid(0), "60000"]);
    let after = info(&mut c, "quota:t");
    assert_eq!(after["used"], before["used"] + 7);
    assert_eq!(after["reserved"], before["reserved"] - 20);
    // Reads work too, and the refused calls changed nothing.
    assert_eq!(after["limit"], 1_000_000_000);
    assert_eq!(ok(&mut c, &["QUOTA.INFO", "quota:new"]), Value::Nil);
    assert_eq!(ok(&mut c, &["EXISTS", "quota:rpm"]), Value::Int(0));
    // Room again: growth resumes.
    ok(&mut c, &["CONFIG", "SET", "maxmemory", "0"]);
    ok(&mut c, &["QUOTA.RESERVE", "quota:t", "1"]);
}

/// A redis-server without the harness: `args` as given, in a fresh directory, listening on a unix
/// socket only unless `args` sets a port. Killed on drop.
struct Plain {
    child: std::process::Child,
    dir: std::path::PathBuf,
}

impl Plain {
    fn start(args: &[&str]) -> Plain {
        let dir = std::env::temp_dir().join(format!(
            "rq-caps-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let child = std::process::Command::new(server_bin())
            .args(["--port", "0", "--save", "", "--dir"])
            .arg(&dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .arg("--unixsocket")
            .arg(dir.join("redis.sock"))
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        Plain { child, dir }
    }

    /// Waits up to 10 s for the process to exit; true if it did.
    fn exits(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Has the process exited already?
    fn exits_now(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }
}

impl Drop for Plain {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `loadmodule` arguments cannot bypass the configs' bounds: Redis 7.0 takes them as defaults
/// without checking, so the module itself refuses to load, and Redis exits at startup.
#[test]
fn loadmodule_arguments_outside_the_caps_refuse_to_load() {
    let module = module_path().display().to_string();
    for (args, reason) in [
        (
            &["max-id-length", "100000"][..],
            "max-id-length must be an integer between 1 and 65536",
        ),
        (
            &["max-id-length", "0"],
            "max-id-length must be an integer between 1 and 65536",
        ),
        (
            &["max-pending", "0"],
            "max-pending must be an integer between 1 and",
        ),
        (
            &["sweep-effort", "-5"],
            "sweep-effort must be an integer between 0 and 1000000",
        ),
        (
            &["finished-ttl", "-1"],
            "finished-ttl must be an integer between 0 and",
        ),
        (&["test-clock", "maybe"], "test-clock must be 'yes' or 'no'"),
        (&["sweep-efort", "5"], "unknown config 'sweep-efort'"),
        (&["sweep-effort", "5", "sweep-effort", "6"], "given twice"),
    ] {
        let mut load = vec!["--loadmodule", module.as_str()];
        load.extend_from_slice(args);
        let mut p = Plain::start(&load);
        assert!(p.exits(), "{args:?}: Redis kept running");
        let log = p.log();
        assert!(
            log.contains(reason),
            "{args:?}: log lacks {reason:?}:\n{log}"
        );
        assert!(log.contains("quota: not loaded"), "{log}");
    }
    // Values inside the bounds load and apply.
    let s = Server::start_with_module_args(
        &[],
        &[
            "max-id-length",
            "65536",
            "sweep-effort",
            "0",
            "max-pending",
            "1",
        ],
    );
    let mut c = s.conn();
    let v: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("quota.max-id-length")
        .query(&mut c)
        .unwrap();
    assert_eq!(v[1], "65536");
}

/// A `MODULE LOAD` refused for its arguments leaves nothing behind: no keyspace subscription or
/// timer pointing into the unloaded library (which would crash Redis at the next RENAME).
#[test]
fn a_refused_module_load_leaves_redis_running() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port().to_string()
    };
    let mut p = Plain::start(&["--port", &port, "--enable-module-command", "yes"]);
    let url = format!("redis://127.0.0.1:{port}/");
    let mut c = {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(c) = redis::Client::open(url.as_str()).unwrap().get_connection() {
                break c;
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let module = module_path().display().to_string();
    // Refused by the crate's parser (before the module's init), then by the module's check.
    for bad in [["max-id-length", "abc"], ["max-id-length", "0"]] {
        let (_, msg) = err(&mut c, &["MODULE", "LOAD", &module, bad[0], bad[1]]);
        assert!(msg.contains("Error loading the extension"), "{msg}");
        // Generic keyspace events and a few timer periods: Redis must still be there.
        ok(&mut c, &["SET", "a", "1"]);
        ok(&mut c, &["RENAME", "a", "b"]);
        ok(&mut c, &["COPY", "b", "c"]);
        std::thread::sleep(Duration::from_millis(200));
        ok(&mut c, &["DEL", "b", "c"]);
    }
    assert!(!p.exits_now(), "Redis died:\n{}", p.log());
    // And a good load still works afterwards.
    ok(&mut c, &["MODULE", "LOAD", &module, "sweep-effort", "10"]);
    ok(&mut c, &["QUOTA.SET", "quota:t", "LIMIT", "5"]);
    ok(&mut c, &["RENAME", "quota:t", "quota:u"]);
    assert_eq!(info(&mut c, "quota:u")["limit"], 5);
}

/// A reservation made under a higher quota.max-id-length can still be settled after the cap
/// is lowered.
#[test]
fn lowering_max_id_length_never_strands_a_reservation() {
    let s = Server::start_with_module_args(&[], &["max-id-length", "1000"]);
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "100"]);
    let id = "x".repeat(500);
    ok(&mut c, &["QUOTA.RESERVE", "t", "10", "ID", &id]);
    ok(&mut c, &["CONFIG", "SET", "quota.max-id-length", "128"]);
    let r = items(&ok(&mut c, &["QUOTA.SETTLE", "t", &id, "7"]));
    assert_eq!((text(&r[0]), int(&r[1])), ("settled".to_string(), 7));
    assert_eq!(info(&mut c, "t")["used"], 7);
}

/// A TTL whose deadline could overflow is refused up front, so it can never make later
/// RESERVEs on the key fail.
#[test]
fn ttl_is_capped_where_it_is_set() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let max = i64::MAX.to_string();
    assert_eq!(
        err(&mut c, &["QUOTA.SET", "t", "LIMIT", "1", "TTL", &max]).0,
        "ERR"
    );
    assert_eq!(keys(&mut c), Vec::<String>::new());
    assert_eq!(
        err(&mut c, &["CONFIG", "SET", "quota.default-ttl", &max]).0,
        "ERR"
    );
    ok(
        &mut c,
        &["QUOTA.SET", "t", "LIMIT", "1", "TTL", "1000000000000000"],
    );
    assert_eq!(int(&items(&ok(&mut c, &["QUOTA.RESERVE", "t", "1"]))[0]), 1);
    assert_eq!(
        err(
            &mut c,
            &["QUOTA.RESERVE", "t", "0", "TTL", "1000000000000001"]
        )
        .0,
        "ERR"
    );
}
