//! Concurrency: many clients race RESERVE on one budget; the total granted never exceeds the
//! limit, exactly, and the ledger reconciles afterwards.
// Tests may panic: the no-panic lints guard the module code only.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::panic
)]

mod common;
use common::*;

#[test]
fn thirty_two_clients_never_over_admit() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // 10_007 is prime: no amount mix divides it, so the last grants are contested.
    ok(&mut c, &["QUOTA.SET", "hot", "LIMIT", "10007"]);
    let port = s.port;
    let handles: Vec<_> = (0..32)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                    .unwrap()
                    .get_connection()
                    .unwrap();
                let mut granted = 0i64;
                let mut ids = Vec::new();
                for i in 0..200 {
                    let amount = 1 + (t * 7 + i) % 13;
                    let r = items(&ok(&mut c, &["QUOTA.RESERVE", "hot", &amount.to_string()]));
                    if int(&r[0]) == 1 {
                        granted += amount;
                        ids.push((text(&r[1]), amount));
                    }
                }
                (granted, ids)
            })
        })
        .collect();
    let mut total = 0;
    let mut all = Vec::new();
    for h in handles {
        let (g, ids) = h.join().unwrap();
        total += g;
        all.extend(ids);
    }
    assert!(total <= 10007, "over-admitted: {total}");
    // Demand (32 × 200 × avg 7) far exceeds the limit: the budget is nearly exhausted.
    assert!(total > 10007 - 13, "under-admitted: {total}");
    let i = info(&mut c, "hot");
    assert_eq!(i["reserved"], total);
    assert_eq!(i["available"], 10007 - total);
    // Settle everything for half; the ledger reconciles to the unit.
    let mut used = 0;
    for (id, amount) in &all {
        ok(
            &mut c,
            &["QUOTA.SETTLE", "hot", id, &(amount / 2).to_string()],
        );
        used += amount / 2;
    }
    let i = info(&mut c, "hot");
    assert_eq!((i["used"], i["reserved"], i["pending"]), (used, 0, 0));
}
