//! A real Redis Cluster on loopback for tests/cluster.rs: 3 masters + 3 replicas, the module
//! loaded on every node, created with `redis-cli --cluster create ... --cluster-replicas 1`
//! (`valkey-cli` under `REDIS_SERVER=valkey-server`). Each node is a [`Server`] (free port with
//! port + 10000 free for the cluster bus, a temp dir), so every node is killed and its dir
//! removed when the [`Cluster`] drops, also when a test panics. Every wait polls the servers'
//! own state (CLUSTER INFO / CLUSTER NODES / INFO replication), never a fixed sleep.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use super::{cli_bin, ok, server_bin, text, Server};

/// How long any wait for the cluster may take before the test fails (a busy 2-CPU machine).
const PATIENCE: Duration = Duration::from_secs(90);

/// Masters in every test cluster; each gets one replica.
pub const MASTERS: usize = 3;

/// One node as some node sees it in `CLUSTER NODES`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    pub id: String,
    pub port: u16,
    pub master: bool,
    /// The master's id, for a replica.
    pub master_id: Option<String>,
    /// `fail` or `fail?` is set.
    pub failing: bool,
    /// Slot ranges served (masters only), as `CLUSTER NODES` prints them.
    pub slots: Vec<String>,
}

/// A 3 + 3 cluster. `nodes[i]` keeps its index for the whole test, whatever its role becomes.
pub struct Cluster {
    pub nodes: Vec<Server>,
    /// `CLUSTER MYID` of each node, by index.
    pub ids: Vec<String>,
    /// Nodes killed and not restarted: waits skip them.
    down: Vec<bool>,
}

impl Cluster {
    /// Starts 6 nodes with `extra` config args, creates the cluster and waits until every node
    /// agrees on it, reports `cluster_state:ok` and every replica is in sync.
    pub fn start(extra: &[&str]) -> Cluster {
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            // Failure detection within seconds, yet no false failover on a busy machine (the
            // suite passed with 3000 at a load average of 14 on 2 CPUs; 5000 leaves a margin).
            "--cluster-node-timeout",
            "5000",
            // A replica may always be promoted, however long its link was down.
            "--cluster-replica-validity-factor",
            "0",
        ];
        args.extend_from_slice(extra);
        let nodes: Vec<Server> = (0..2 * MASTERS).map(|_| Server::start(&args)).collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new(cli_bin())
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run {} ({e}): make deps", cli_bin()));
        assert!(
            out.status.success(),
            "{} --cluster create failed:\n{}\n{}",
            cli_bin(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let ids = nodes
            .iter()
            .map(|n| text(&ok(&mut n.conn(), &["CLUSTER", "MYID"])))
            .collect();
        let c = Cluster {
            nodes,
            ids,
            down: vec![false; 2 * MASTERS],
        };
        c.wait_stable();
        c
    }

    /// Seed addresses for a cluster client: every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}/", n.port))
            .collect()
    }

    /// A cluster-aware client (redis-rs `ClusterClient`), as a gateway would use it: it routes
    /// by key slot and follows MOVED and ASK.
    pub fn client(&self) -> redis::cluster::ClusterConnection {
        redis::cluster::ClusterClientBuilder::new(self.urls())
            .connection_timeout(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(20))
            .retries(30)
            .build()
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// A plain connection to node `i`.
    pub fn conn(&self, i: usize) -> redis::Connection {
        self.nodes[i].conn()
    }

    /// The index of the node with `CLUSTER MYID` `id`.
    pub fn index_of(&self, id: &str) -> usize {
        self.ids
            .iter()
            .position(|x| x == id)
            .unwrap_or_else(|| panic!("unknown node id {id}"))
    }

    /// Whether node `i` is up (not killed by the test).
    pub fn is_up(&self, i: usize) -> bool {
        !self.down[i]
    }

    /// `CLUSTER NODES` as node `i` sees it.
    pub fn view(&self, i: usize) -> Vec<NodeView> {
        let s: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut self.conn(i))
            .unwrap();
        let mut v: Vec<NodeView> = s.lines().filter_map(parse_node_line).collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// Indices of the masters that serve slots, as node `at` sees it.
    pub fn masters_seen_by(&self, at: usize) -> Vec<usize> {
        let mut m: Vec<usize> = self
            .view(at)
            .iter()
            .filter(|n| n.master && !n.slots.is_empty())
            .map(|n| self.index_of(&n.id))
            .collect();
        m.sort_unstable();
        m
    }

    /// Indices of the masters serving slots (as the first live node sees it).
    pub fn masters(&self) -> Vec<usize> {
        self.masters_seen_by(self.any_up())
    }

    /// The live replica of master `m`.
    pub fn replica_of(&self, m: usize) -> usize {
        let view = self.view(self.any_up());
        view.iter()
            .filter(|n| n.master_id.as_deref() == Some(self.ids[m].as_str()))
            .map(|n| self.index_of(&n.id))
            .find(|&i| self.is_up(i))
            .unwrap_or_else(|| panic!("master {m} has no live replica: {view:?}"))
    }

    fn any_up(&self) -> usize {
        (0..self.nodes.len())
            .find(|&i| self.is_up(i))
            .expect("a live node")
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    pub fn keyslot(&self, key: &str) -> u16 {
        let n: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.conn(self.any_up()))
            .unwrap();
        u16::try_from(n).unwrap()
    }

    /// The master serving `slot` (`CLUSTER SHARDS`-free: from CLUSTER NODES' slot ranges).
    pub fn owner_of_slot(&self, slot: u16) -> usize {
        for n in self.view(self.any_up()) {
            if !n.master {
                continue;
            }
            for r in &n.slots {
                if r.starts_with('[') {
                    continue; // an importing/migrating marker, not ownership
                }
                let (lo, hi) = match r.split_once('-') {
                    Some((lo, hi)) => (lo.parse::<u16>().unwrap(), hi.parse::<u16>().unwrap()),
                    None => {
                        let s = r.parse::<u16>().unwrap();
                        (s, s)
                    }
                };
                if (lo..=hi).contains(&slot) {
                    return self.index_of(&n.id);
                }
            }
        }
        panic!("slot {slot} has no owner");
    }

    /// The master serving `key`.
    pub fn owner_of(&self, key: &str) -> usize {
        self.owner_of_slot(self.keyslot(key))
    }

    /// A hash tag (`{<prefix><n>}`, smallest n) whose slot master `m` serves.
    pub fn tag_on(&self, m: usize, prefix: &str) -> String {
        (0..10_000)
            .map(|n| format!("{{{prefix}{n}}}"))
            .find(|tag| self.owner_of(tag) == m)
            .unwrap_or_else(|| panic!("no {prefix} tag on master {m}"))
    }

    /// Polls until every live node reports `cluster_state:ok`, all live nodes' views of the
    /// topology (roles, masters, slots) agree, no live node is flagged failing, every slot is
    /// served, and every replica is linked and in sync with its master.
    pub fn wait_stable(&self) {
        let deadline = Instant::now() + PATIENCE;
        while let Err(why) = self.stable() {
            assert!(
                Instant::now() < deadline,
                "cluster not stable after {PATIENCE:?}: {why}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.wait_synced();
    }

    fn stable(&self) -> Result<(), String> {
        let live: Vec<usize> = (0..self.nodes.len()).filter(|&i| self.is_up(i)).collect();
        let mut first: Option<Vec<NodeView>> = None;
        for &i in &live {
            let mut c = self.conn(i);
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut c)
                .map_err(|e| e.to_string())?;
            if !info.contains("cluster_state:ok") {
                return Err(format!("node {i}: not ok"));
            }
            let view = self.view(i);
            if view.len() != self.nodes.len() {
                return Err(format!("node {i} knows {} nodes", view.len()));
            }
            for n in &view {
                let j = self.index_of(&n.id);
                if self.is_up(j) && n.failing {
                    return Err(format!("node {i} sees live node {j} failing"));
                }
            }
            // Compare what matters, not link states or ping times.
            let masters: Vec<(String, Vec<String>)> = view
                .iter()
                .filter(|n| n.master && !n.slots.is_empty())
                .map(|n| (n.id.clone(), n.slots.clone()))
                .collect();
            if masters.len() != MASTERS {
                return Err(format!("node {i} sees {} masters", masters.len()));
            }
            match &first {
                None => first = Some(view),
                Some(f) => {
                    let roles =
                        |v: &[NodeView]| -> Vec<(String, bool, Option<String>, Vec<String>)> {
                            v.iter()
                                .filter(|n| self.is_up(self.index_of(&n.id)))
                                .map(|n| {
                                    (n.id.clone(), n.master, n.master_id.clone(), n.slots.clone())
                                })
                                .collect()
                        };
                    if roles(f) != roles(&view) {
                        return Err(format!("views differ: {f:?} vs node {i}: {view:?}"));
                    }
                }
            }
            // A replica's own view of its link.
            let repl: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut c)
                .map_err(|e| e.to_string())?;
            if repl.contains("role:slave") && !repl.contains("master_link_status:up") {
                return Err(format!("node {i}: replica link down"));
            }
        }
        Ok(())
    }

    /// Polls until every live replica has processed its master's replication stream up to the
    /// master's offset read at the start.
    pub fn wait_synced(&self) {
        let deadline = Instant::now() + PATIENCE;
        for m in self.masters() {
            let master_offset = repl_field(&mut self.conn(m), "master_repl_offset");
            let view = self.view(m);
            for n in view
                .iter()
                .filter(|n| n.master_id.as_deref() == Some(self.ids[m].as_str()))
            {
                let r = self.index_of(&n.id);
                if !self.is_up(r) {
                    continue;
                }
                let mut c = self.conn(r);
                loop {
                    let info: String = redis::cmd("INFO").arg("replication").query(&mut c).unwrap();
                    let linked = info.contains("master_link_status:up");
                    let offset = field(&info, "slave_repl_offset").unwrap_or(-1);
                    if linked && offset >= master_offset {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "replica {r} of {m} not in sync (offset {offset} < {master_offset}):\n{info}"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    /// SIGKILL node `i` (no shutdown, no save). The waits skip it until [`Cluster::restart`].
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
        self.down[i] = true;
    }

    /// Starts a killed node again on its port and dir (its nodes.conf, and its AOF if the
    /// cluster runs with `--appendonly yes`): it rejoins with its old id.
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].kill_and_restart();
        self.down[i] = false;
    }

    /// Polls until the live replica `r` has been promoted to master, as every live node sees it.
    pub fn wait_promoted(&self, r: usize) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let seen = (0..self.nodes.len())
                .filter(|&i| self.is_up(i))
                .all(|i| self.masters_seen_by(i).contains(&r));
            if seen {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {r} was not promoted: {:?}",
                self.view(r)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `(key, DEBUG DIGEST-VALUE)` of every key on node `i`.
    pub fn digests(&self, i: usize) -> Vec<(String, String)> {
        super::all_digests(&mut self.conn(i))
    }

    /// The server binary and version the cluster runs (for messages).
    pub fn describe(&self) -> String {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut self.conn(self.any_up()))
            .unwrap();
        format!(
            "{} ({})",
            server_bin(),
            field_text(&info, "redis_version").unwrap_or_default()
        )
    }
}

/// Parses one `CLUSTER NODES` line.
fn parse_node_line(line: &str) -> Option<NodeView> {
    let w: Vec<&str> = line.split_whitespace().collect();
    if w.len() < 8 {
        return None;
    }
    let addr = w[1].split('@').next()?;
    let port = addr.rsplit(':').next()?.parse().ok()?;
    let flags: Vec<&str> = w[2].split(',').collect();
    Some(NodeView {
        id: w[0].to_string(),
        port,
        master: flags.contains(&"master"),
        master_id: (w[3] != "-").then(|| w[3].to_string()),
        failing: flags.contains(&"fail") || flags.contains(&"fail?"),
        slots: w[8..].iter().map(|s| s.to_string()).collect(),
    })
}

fn field_text(info: &str, name: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
        .map(str::to_string)
}

fn field(info: &str, name: &str) -> Option<i64> {
    field_text(info, name)?.parse().ok()
}

/// One integer field of `INFO replication`.
pub fn repl_field(c: &mut redis::Connection, name: &str) -> i64 {
    let info: String = redis::cmd("INFO").arg("replication").query(c).unwrap();
    field(&info, name).unwrap_or_else(|| panic!("no {name} in:\n{info}"))
}

/// One integer field of `INFO <section>` (e.g. `quota` / `quota_sweeper_released`).
pub fn info_int(c: &mut redis::Connection, section: &str, name: &str) -> i64 {
    let info: String = redis::cmd("INFO").arg(section).query(c).unwrap();
    field(&info, name).unwrap_or_else(|| panic!("no {name} in:\n{info}"))
}

/// How often a command ran on a server (`INFO commandstats`, `calls=`); 0 if never.
pub fn command_calls(c: &mut redis::Connection, name: &str) -> i64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
    info.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("cmdstat_{name}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// Runs a command on any connection (a cluster client or a plain one); the reply or the error.
pub fn gq<C: redis::ConnectionLike>(c: &mut C, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(c)
}

/// Runs a command that must succeed, on any connection.
pub fn gok<C: redis::ConnectionLike>(c: &mut C, args: &[&str]) -> redis::Value {
    gq(c, args).unwrap_or_else(|e| panic!("{args:?} failed: {e}"))
}

/// Runs a command that must fail, on any connection: (code, full text).
pub fn gerr<C: redis::ConnectionLike>(c: &mut C, args: &[&str]) -> (String, String) {
    match gq(c, args) {
        Ok(v) => panic!("{args:?} should fail, got {v:?}"),
        Err(e) => (e.code().unwrap_or("").to_string(), e.to_string()),
    }
}

/// QUOTA.INFO as (field, integer) pairs, on any connection; panics on nil.
pub fn ginfo<C: redis::ConnectionLike>(c: &mut C, key: &str) -> BTreeMap<String, i64> {
    match gok(c, &["QUOTA.INFO", key]) {
        redis::Value::Array(a) => a
            .chunks(2)
            .filter_map(|p| match &p[1] {
                redis::Value::Int(n) => Some((text(&p[0]), *n)),
                _ => None,
            })
            .collect(),
        other => panic!("QUOTA.INFO {key}: {other:?}"),
    }
}

/// QUOTA.PENDING (up to 10000) as id -> amount, on any connection.
pub fn gpending<C: redis::ConnectionLike>(c: &mut C, key: &str) -> BTreeMap<String, i64> {
    super::items(&gok(c, &["QUOTA.PENDING", key, "COUNT", "10000"]))
        .iter()
        .map(|e| {
            let e = super::items(e);
            (text(&e[0]), super::int(&e[1]))
        })
        .collect()
}
