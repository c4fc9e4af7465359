//! Determinism and persistence: a replica, AOF restarts (with and without the RDB preamble),
//! DEBUG RELOAD, DUMP/RESTORE, COPY and RENAME must all reach byte-identical state
//! (`DEBUG DIGEST-VALUE` equal) under a random workload with time passing and short TTLs.

mod common;
use common::*;
use std::time::Duration;

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

/// A random mix of every write command over a few keys, with reservations that expire while
/// the workload runs (TTL 5..60 ms) and finished ids forgotten (finished-ttl is short).
fn workload(c: &mut redis::Connection, seed: u64, ops: usize) {
    let mut rng = Rng(seed | 1);
    let keys = ["tenant:a", "tenant:b", "tenant:{c}", "bin\u{1}key"];
    // Each key its expiry policy and unit: expiries charge in full, by the time to the last
    // heartbeat (EXTEND), or nothing; SETTLE ELAPSED needs a unit.
    let policies: [&[&str]; 4] = [
        &["ONEXPIRE", "CHARGE", "UNIT", "s"],
        &["ONEXPIRE", "ELAPSED", "UNIT", "ms"],
        &["UNIT", "ms"],
        &[],
    ];
    let mut ids: Vec<(usize, String)> = Vec::new();
    for (k, extra) in keys.iter().zip(policies) {
        let mut set = vec![
            "QUOTA.SET",
            k,
            "LIMIT",
            "5000",
            "OVERDRAFT",
            "50",
            "TTL",
            "40",
        ];
        set.extend_from_slice(extra);
        ok(c, &set);
    }
    for i in 0..ops {
        let k = rng.below(keys.len() as u64) as usize;
        let key = keys[k];
        match rng.below(10) {
            0..=3 => {
                let amount = (rng.below(300)).to_string();
                let ttl = (5 + rng.below(55)).to_string();
                let keep = (200 + rng.below(2000)).to_string();
                let r = match rng.below(4) {
                    0 => {
                        let id = format!("user-{i}");
                        q(c, &["QUOTA.RESERVE", key, &amount, "ID", &id, "TTL", &ttl])
                    }
                    1 => q(
                        c,
                        &["QUOTA.RESERVE", key, &amount, "TTL", &ttl, "KEEP", &keep],
                    ),
                    _ => q(c, &["QUOTA.RESERVE", key, &amount, "TTL", &ttl]),
                };
                if let Ok(Value::Array(a)) = r {
                    if let Value::BulkString(id) = &a[1] {
                        ids.push((k, String::from_utf8_lossy(id).into_owned()));
                    }
                }
            }
            4..=5 if !ids.is_empty() => {
                let (k, id) = ids[rng.below(ids.len() as u64) as usize].clone();
                let actual = if rng.below(3) == 0 {
                    "ELAPSED".to_string()
                } else {
                    rng.below(400).to_string()
                };
                let _ = q(c, &["QUOTA.SETTLE", keys[k], &id, &actual]);
            }
            6 if !ids.is_empty() => {
                let (k, id) = ids[rng.below(ids.len() as u64) as usize].clone();
                let _ = q(c, &["QUOTA.ROLLBACK", keys[k], &id]);
            }
            7 if !ids.is_empty() => {
                let (k, id) = ids[rng.below(ids.len() as u64) as usize].clone();
                let _ = q(c, &["QUOTA.EXTEND", keys[k], &id, "30"]);
            }
            8 => {
                let amount = rng.below(100).to_string();
                let id = format!("charge-{}", rng.below(50));
                if rng.below(2) == 0 {
                    let _ = q(c, &["QUOTA.CHARGE", key, &amount, "ID", &id, "KEEP", "100"]);
                } else {
                    let _ = q(c, &["QUOTA.CHARGE", key, &amount, "FORCE"]);
                }
            }
            _ => {
                if rng.below(20) == 0 {
                    ok(
                        c,
                        &[
                            "QUOTA.SET",
                            key,
                            "LIMIT",
                            &(3000 + rng.below(4000)).to_string(),
                        ],
                    );
                }
                std::thread::sleep(Duration::from_millis(rng.below(4)));
            }
        }
    }
}

#[test]
fn replica_reaches_identical_digests() {
    // Finished ids are forgotten after 300 ms on the master, and its sweeper runs.
    let master = Server::start_with_module_args(&[], &["finished-ttl", "300"]);
    // The replica's own configs differ on purpose: effects carry every resolved value.
    let replica =
        Server::start_with_module_args(&[], &["finished-ttl", "999999", "max-pending", "1"]);
    let mut m = master.conn();
    let mut r = replica.conn();
    replica.replicate_from(&master);
    workload(&mut m, 42, 1500);
    // Quiescence: every short TTL (<= 90 ms) and every finished id (300 ms) is now due and
    // handled by the master's sweeper, which replicates each release and forget.
    std::thread::sleep(Duration::from_millis(1000));
    let swept: String = redis::cmd("INFO").arg("quota").query(&mut m).unwrap();
    assert!(!swept.contains("quota_sweeper_released:0\r"), "{swept}");
    // A last burst leaves pending reservations and remembered ids to compare.
    ok(&mut m, &["QUOTA.SET", "tenant:a", "LIMIT", "1000000000"]);
    for i in 0..40 {
        let id = format!("final-{i}");
        ok(
            &mut m,
            &["QUOTA.RESERVE", "tenant:a", "1", "ID", &id, "TTL", "60000"],
        );
        if i % 2 == 0 {
            ok(&mut m, &["QUOTA.SETTLE", "tenant:a", &id, "1"]);
        }
    }
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(acked, 1);
    let md = all_digests(&mut m);
    assert_eq!(md.len(), 4);
    assert_eq!(md, all_digests(&mut r));
    // The replica serves reads of the same state.
    assert_eq!(info(&mut m, "tenant:a"), info(&mut r, "tenant:a"));
    let p = items(&ok(&mut r, &["QUOTA.PENDING", "tenant:a"]));
    assert_eq!(p.len(), 20);
}

fn aof_round_trip(preamble: &str) {
    let mut s = Server::start_with_module_args(
        &[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--aof-use-rdb-preamble",
            preamble,
        ],
        // Sweeper off: it would release the workload's short reservations on its own between
        // reading the digests and the restart (or right after it), a race, not a divergence.
        &["finished-ttl", "60", "sweep-effort", "0"],
    );
    let mut c = s.conn();
    workload(&mut c, 7, 800);
    let before = all_digests(&mut c);
    // Replay of the incremental AOF (effects).
    s.restart();
    let mut c = s.conn();
    assert_eq!(
        before,
        all_digests(&mut c),
        "AOF replay (preamble {preamble})"
    );
    // Rewrite (QUOTA.LOAD, or RDB preamble) and replay again.
    ok(&mut c, &["BGREWRITEAOF"]);
    for _ in 0..200 {
        let info: String = redis::cmd("INFO").arg("persistence").query(&mut c).unwrap();
        if info.contains("aof_rewrite_in_progress:0") && !info.contains("aof_rewrite_scheduled:1") {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    std::thread::sleep(Duration::from_millis(100));
    workload(&mut c, 8, 200);
    let before = all_digests(&mut c);
    s.restart();
    let mut c = s.conn();
    assert_eq!(
        before,
        all_digests(&mut c),
        "AOF rewrite + replay (preamble {preamble})"
    );
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
    let s = Server::start_with_module_args(&[], &["sweep-effort", "0"]);
    let mut c = s.conn();
    workload(&mut c, 99, 400);
    let before = all_digests(&mut c);
    ok(&mut c, &["DEBUG", "RELOAD"]);
    assert_eq!(before, all_digests(&mut c));

    let d0 = digest(&mut c, "tenant:a");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("tenant:a").query(&mut c).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("restored")
        .arg(0)
        .arg(&dump)
        .query(&mut c)
        .unwrap();
    assert_eq!(digest(&mut c, "restored"), d0);
    ok(&mut c, &["COPY", "tenant:a", "copied"]);
    assert_eq!(digest(&mut c, "copied"), d0);
    ok(&mut c, &["RENAME", "tenant:a", "renamed"]);
    assert_eq!(digest(&mut c, "renamed"), d0);
    // INFO reads at the wall clock: wait until every workload TTL (<= 90 ms with EXTEND) has
    // passed, so no reservation expires between the two reads.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(info(&mut c, "renamed"), info(&mut c, "copied"));
    // MEMORY USAGE reflects the reservation book, not a constant.
    let small: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("copied")
        .query(&mut c)
        .unwrap();
    ok(&mut c, &["QUOTA.SET", "big", "LIMIT", "100000000"]);
    for i in 0..2000 {
        ok(
            &mut c,
            &["QUOTA.RESERVE", "big", "1", "ID", &format!("r{i}")],
        );
    }
    let big: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("big")
        .query(&mut c)
        .unwrap();
    assert!(
        big > small + 2000 * 40,
        "MEMORY USAGE big={big} small={small}"
    );
}

#[test]
fn key_ttl_survives_writes() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "100"]);
    ok(&mut c, &["PEXPIRE", "t", "100000"]);
    ok(&mut c, &["QUOTA.RESERVE", "t", "1", "ID", "a"]);
    ok(&mut c, &["QUOTA.SETTLE", "t", "a", "1"]);
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "200"]);
    let ttl = int(&ok(&mut c, &["PTTL", "t"]));
    assert!(ttl > 90_000, "PTTL {ttl}");
}
