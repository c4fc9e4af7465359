#!/usr/bin/env bash
# `make cluster`: a Redis Cluster of 3 masters + 3 replicas on 127.0.0.1 with the module loaded on
# every node, for a person to try (not for production: one machine, loopback only).
#   scripts/cluster.sh path/to/libredis_quota.so
# Env: PORT (first port, default 30001; the nodes take PORT..PORT+5 and, for the cluster bus,
# PORT+10000..PORT+10005), REDIS_SERVER (default redis-server; valkey-server works too),
# REDIS_CLI (default: the server's name with -server replaced by -cli).
# Runs in the foreground; Ctrl-C (SIGINT) or SIGTERM stops every node and removes the data.
set -euo pipefail

module=${1:?usage: $0 path/to/libredis_quota.so}
server=${REDIS_SERVER:-redis-server}
cli=${REDIS_CLI:-${server%-server}-cli}
first=${PORT:-30001}
nodes=6

[ -f "$module" ] || { echo "cluster: no module at $module (make release)" >&2; exit 1; }
module=$(cd "$(dirname "$module")" && pwd)/$(basename "$module")
command -v "$server" >/dev/null || { echo "cluster: $server not found (make deps)" >&2; exit 1; }
command -v "$cli" >/dev/null || { echo "cluster: $cli not found (make deps)" >&2; exit 1; }

ports=()
for ((i = 0; i < nodes; i++)); do ports+=($((first + i))); done

# A port is taken if something accepts a connection on it.
in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for p in "${ports[@]}"; do
  for q in "$p" $((p + 10000)); do
    if in_use "$q"; then
      echo "cluster: port $q is in use; pick other ports with: make cluster CLUSTER_PORT=<first port>" >&2
      exit 1
    fi
  done
done

dir=$(mktemp -d -t redis-quota-cluster.XXXXXX)
pids=()
stopping=0
say() { echo "$@" 2>/dev/null || true; } # the terminal may be gone (SIGHUP)
cleanup() {
  [ "$stopping" = 1 ] && return
  stopping=1
  # A second signal (make forwards one, a closing terminal sends SIGHUP) must not cut this short.
  trap '' INT TERM HUP
  set +e
  say
  say "cluster: stopping the ${#pids[@]} nodes"
  for p in "${ports[@]}"; do
    "$cli" -p "$p" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  done
  for pid in "${pids[@]}"; do
    # Only if SHUTDOWN did not end it: our own child, by its pid.
    kill -0 "$pid" 2>/dev/null && kill -TERM "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$dir"
  say "cluster: stopped; $dir removed"
}
trap cleanup EXIT
trap 'exit 0' INT  # Ctrl-C is how it is meant to stop: not an error for make
trap 'exit 0' TERM HUP

for p in "${ports[@]}"; do
  mkdir -p "$dir/$p"
  # Started in the background of a non-interactive shell: they ignore the terminal's SIGINT,
  # so Ctrl-C reaches this script, which shuts them down in order.
  "$server" --port "$p" --bind 127.0.0.1 --dir "$dir/$p" --logfile "$dir/$p/server.log" \
    --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000 \
    --appendonly yes --save "" --enable-debug-command local \
    --loadmodule "$module" >/dev/null 2>&1 &
  pids+=($!)
done

deadline=$((SECONDS + 30))
for p in "${ports[@]}"; do
  until [ "$("$cli" -p "$p" PING 2>/dev/null)" = PONG ]; do
    if ((SECONDS > deadline)); then
      echo "cluster: node $p did not start; its log:" >&2
      tail -20 "$dir/$p/server.log" >&2 || true
      exit 1
    fi
    sleep 0.1
  done
done

addrs=()
for p in "${ports[@]}"; do addrs+=("127.0.0.1:$p"); done
if ! "$cli" --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1; then
  echo "cluster: $cli --cluster create failed:" >&2
  cat "$dir/create.log" >&2
  exit 1
fi

deadline=$((SECONDS + 60))
for p in "${ports[@]}"; do
  until "$cli" -p "$p" CLUSTER INFO 2>/dev/null | grep -q '^cluster_state:ok'; do
    if ((SECONDS > deadline)); then
      echo "cluster: node $p never reported cluster_state:ok" >&2
      exit 1
    fi
    sleep 0.1
  done
done

# Every node sees 3 masters serving slots and 3 linked replicas.
until [ "$(for p in "${ports[@]}"; do
  "$cli" -p "$p" CLUSTER NODES 2>/dev/null | awk '$3 ~ /slave/ && $8 == "connected"' | wc -l
  "$cli" -p "$p" INFO replication 2>/dev/null | grep -c '^master_link_status:up'
done | tr -d ' \r' | sort | uniq -c | awk '{printf "%s:%s ", $2, $1}')" = "0:3 1:3 3:6 " ]; do
  if ((SECONDS > deadline)); then
    echo "cluster: the replicas did not all join" >&2
    exit 1
  fi
  sleep 0.1
done

version=$("$server" --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')
echo "redis-quota cluster: $server $version, 3 masters + 3 replicas, module $module"
echo
"$cli" -p "$first" CLUSTER NODES | awk '{
  split($2, a, "[:@]"); port[$1] = a[2]; role[$1] = ($3 ~ /master/) ? "master" : "replica";
  of[$1] = $4; slots[$1] = ""; for (i = 9; i <= NF; i++) slots[$1] = slots[$1] " " $i }
  END { for (id in port) {
    what = (role[id] == "master") ? "slots" slots[id] : "of 127.0.0.1:" port[of[id]];
    printf "  127.0.0.1:%s  %-8s %s\n", port[id], role[id], what } }' | sort
echo
echo "Connect (-c follows MOVED/ASK redirections):"
echo "  $cli -c -p $first"
echo "Try (the {t_1001} hash tag keeps a tenant's keys in one slot):"
echo "  QUOTA.SET quota:{t_1001}:key:k9:day LIMIT 100000 PERIOD DAY"
echo "  QUOTA.RESERVE quota:{t_1001}:key:k9:day 2000 ID req-1"
echo "  QUOTA.SETTLE quota:{t_1001}:key:k9:day req-1 1234"
echo "  QUOTA.INFO quota:{t_1001}:key:k9:day"
echo "  CLUSTER KEYSLOT quota:{t_1001}:key:k9:day"
echo "Cluster clients take any node as a seed: redis://127.0.0.1:$first ... redis://127.0.0.1:${ports[-1]}"
echo "Data and logs: $dir (removed on stop). Ctrl-C stops the cluster."

# Until Ctrl-C, or until a node dies by itself.
while :; do
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      echo "cluster: node ${ports[$i]} exited; its log:" >&2
      tail -20 "$dir/${ports[$i]}/server.log" >&2 || true
      exit 1
    fi
  done
  sleep 1 &
  wait $! || true
done
