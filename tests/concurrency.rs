//! Concurrency: many clients race RESERVE on one budget; the total granted never exceeds the
//! limit, exactly, and the ledger reconciles afterwards.

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

/// One tenant's limits for the multi-limit race (issue 19): three budgets (API key, team, org)
/// and two configured window keys (RPM, TPM) of an hour, so nothing leaves them during the test.
const MULTI: [&str; 5] = [
    "quota:{t_1001}:key:k9:day",
    "quota:{t_1001}:team:t3:month",
    "quota:{t_1001}:org:month",
    "quota:{t_1001}:rpm",
    "quota:{t_1001}:tpm",
];
/// Limits near each other in requests (~1700–2000 of the mix below each), primes so that no
/// amount mix divides them: which key binds depends on the interleaving.
const MULTI_LIMITS: [i64; 5] = [20_011, 17_011, 40_009, 1_999, 200_003];
/// The largest amount `request` asks of each key.
const MULTI_MAX: [i64; 5] = [23, 19, 41, 1, 230];

/// What client `t`'s `i`-th request asks of each key.
fn request(t: usize, i: usize) -> [i64; 5] {
    let tok = 1 + ((t * 7 + i * 3) % 23) as i64;
    // Loosely correlated per key, so that different keys run out at different times.
    [
        tok,
        1 + (tok * 5) % 19,
        1 + (tok * 11) % 41,
        1,
        10 * (1 + (tok * 7) % 23),
    ]
}

/// What a request settles at: half its tokens, still one request.
fn actual(a: &[i64; 5]) -> [i64; 5] {
    [a[0] / 2, a[1] / 2, a[2] / 2, 1, a[4] / 2]
}

fn connect(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_connection()
        .unwrap()
}

/// `QUOTA.MRESERVE 5 keys.. amounts..`: `Some(id)` if granted. Checks the reply's shape and,
/// on a denial, that the key it names lacked room for its amount.
fn mreserve(c: &mut redis::Connection, a: &[i64; 5]) -> Option<String> {
    let mut args: Vec<String> = vec!["QUOTA.MRESERVE".into(), "5".into()];
    args.extend(MULTI.iter().map(|k| k.to_string()));
    args.extend(a.iter().map(i64::to_string));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = items(&ok(c, &args));
    assert_eq!(r.len(), 5, "{r:?}");
    let values: Vec<i64> = items(&r[4]).iter().map(int).collect();
    assert_eq!(values.len(), 5, "{r:?}");
    if int(&r[0]) == 1 {
        assert_eq!(int(&r[2]), -1, "{r:?}");
        for (j, v) in values.iter().enumerate() {
            assert!(
                (0..=MULTI_LIMITS[j]).contains(v),
                "key {j} value {v}: {r:?}"
            );
        }
        Some(text(&r[1]))
    } else {
        assert_eq!(r[1], Value::Nil, "{r:?}");
        let j = usize::try_from(int(&r[2])).unwrap();
        assert!(j < 5, "{r:?}");
        assert!(values[j] < a[j], "key {j} denied {a:?} with room: {r:?}");
        None
    }
}

/// `QUOTA.MSETTLE 5 keys.. id actuals..`: the five `[status, charged, value]` replies.
fn msettle(c: &mut redis::Connection, id: &str, actual: &[i64; 5]) -> Vec<(String, i64)> {
    let mut args: Vec<String> = vec!["QUOTA.MSETTLE".into(), "5".into()];
    args.extend(MULTI.iter().map(|k| k.to_string()));
    args.push(id.into());
    args.extend(actual.iter().map(i64::to_string));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = items(&ok(c, &args));
    assert_eq!(r.len(), 5, "{r:?}");
    r.iter()
        .map(|x| {
            let x = items(x);
            assert_eq!(x.len(), 3, "{r:?}");
            (text(&x[0]), int(&x[1]))
        })
        .collect()
}

/// Each key's (budget) `used` and `reserved`, or (window) `counted` twice.
fn multi_state(c: &mut redis::Connection) -> Vec<(i64, i64)> {
    MULTI
        .iter()
        .enumerate()
        .map(|(j, k)| {
            let i = info(c, k);
            if j < 3 {
                (i["used"], i["reserved"])
            } else {
                (i["counted"], i["counted"])
            }
        })
        .collect()
}

fn add(sum: &mut [i64; 5], a: &[i64; 5]) {
    for (s, x) in sum.iter_mut().zip(a) {
        *s += x;
    }
}

#[test]
fn clients_racing_mreserve_over_five_keys_never_over_admit() {
    const THREADS: usize = 24;
    let s = Server::start(&[]);
    let mut c = s.conn();
    for (j, k) in MULTI.iter().enumerate() {
        let limit = MULTI_LIMITS[j].to_string();
        if j < 3 {
            ok(&mut c, &["QUOTA.SET", k, "LIMIT", &limit, "TTL", "3600000"]);
        } else {
            ok(&mut c, &["QUOTA.SET", k, "WINDOW", &limit, "3600000"]);
        }
    }
    let port = s.port;

    // Phase 1: every client races MRESERVE over the same five keys; demand (24 × 120
    // requests) exceeds every limit.
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = connect(port);
                let mut granted = Vec::new();
                for i in 0..120 {
                    let a = request(t, i);
                    if let Some(id) = mreserve(&mut c, &a) {
                        granted.push((id, a));
                    }
                }
                granted
            })
        })
        .collect();
    let mut grants: Vec<(String, [i64; 5])> = Vec::new();
    for h in handles {
        grants.extend(h.join().unwrap());
    }
    let mut taken = [0i64; 5];
    for (_, a) in &grants {
        add(&mut taken, a);
    }
    assert!(grants.len() < THREADS * 120, "no request was denied");
    let mut ids: Vec<&str> = grants.iter().map(|(id, _)| id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), grants.len(), "an id was granted twice");
    let state = multi_state(&mut c);
    for j in 0..5 {
        // Budgets hold it all reserved, windows count it all: exactly what the replies granted.
        let held = if j < 3 { state[j].1 } else { state[j].0 };
        assert_eq!(held, taken[j], "key {j}: {state:?} vs granted {taken:?}");
        assert!(held <= MULTI_LIMITS[j], "key {j} over-admitted: {held}");
        if j < 3 {
            assert_eq!(state[j].0, 0, "key {j} used");
        }
    }
    eprintln!(
        "phase 1: {} of {} requests granted, taken {taken:?} of {MULTI_LIMITS:?}",
        grants.len(),
        THREADS * 120
    );
    // A denial left its key without room for that amount; nothing refunds in phase 1.
    assert!(
        (0..5).any(|j| MULTI_LIMITS[j] - taken[j] < MULTI_MAX[j]),
        "no key is anywhere near its limit: {taken:?}"
    );

    // Phase 2: every id is settled by two clients at once (a duplicate racing the first), at
    // half its tokens, while the same clients race new MRESERVEs for the room given back.
    let grants = std::sync::Arc::new(grants);
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let grants = grants.clone();
            std::thread::spawn(move || {
                let mut c = connect(port);
                let mut settles = Vec::new();
                let mut granted = Vec::new();
                let mine: Vec<usize> = (0..grants.len())
                    .filter(|x| x % THREADS == t || x % THREADS == (t + 1) % THREADS)
                    .collect();
                for (n, &x) in mine.iter().enumerate() {
                    let (id, a) = &grants[x];
                    settles.push((x, msettle(&mut c, id, &actual(a))));
                    if n % 2 == 0 {
                        let a = request(t, 1000 + n);
                        if let Some(id) = mreserve(&mut c, &a) {
                            granted.push((id, a));
                        }
                    }
                }
                (settles, granted)
            })
        })
        .collect();
    let mut settles: Vec<Vec<Vec<(String, i64)>>> = vec![Vec::new(); grants.len()];
    let mut grants2: Vec<[i64; 5]> = Vec::new();
    for h in handles {
        let (s, g) = h.join().unwrap();
        for (x, r) in s {
            settles[x].push(r);
        }
        grants2.extend(g.into_iter().map(|(_, a)| a));
    }
    let mut used = [0i64; 5];
    let mut reserved2 = [0i64; 5];
    for (x, (_, a)) in grants.iter().enumerate() {
        let act = actual(a);
        add(&mut used, &act);
        // Settled by exactly two clients; each budget charged once, the other settle a duplicate.
        assert_eq!(settles[x].len(), 2);
        for j in 0..3 {
            let mut statuses: Vec<&str> = settles[x].iter().map(|r| r[j].0.as_str()).collect();
            statuses.sort_unstable();
            assert_eq!(statuses, ["duplicate", "settled"], "id {x} key {j}");
            assert!(
                settles[x].iter().all(|r| r[j].1 == act[j]),
                "{:?}",
                settles[x]
            );
        }
        for j in 3..5 {
            assert!(
                settles[x].iter().any(|r| r[j].0 == "corrected"),
                "id {x} key {j}: {:?}",
                settles[x]
            );
        }
    }
    for a in &grants2 {
        add(&mut reserved2, a);
    }
    eprintln!(
        "phase 2: {} settled twice each, {} new grants",
        grants.len(),
        grants2.len()
    );
    let state = multi_state(&mut c);
    for j in 0..5 {
        if j < 3 {
            assert_eq!(state[j], (used[j], reserved2[j]), "budget {j}");
            assert!(
                used[j] + reserved2[j] <= MULTI_LIMITS[j],
                "budget {j} over-admitted"
            );
        } else {
            // The window counts each settled request once at its actual (a duplicate settle
            // corrects nothing more) and each new grant at its amount.
            let counted = used[j] + reserved2[j];
            assert_eq!(
                state[j].0, counted,
                "window {j}: phase 2 grants {reserved2:?}"
            );
            assert!(counted <= MULTI_LIMITS[j], "window {j} over-admitted");
        }
    }
}
