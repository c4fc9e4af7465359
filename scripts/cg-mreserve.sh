#!/bin/bash
# Instructions per QUOTA.MRESERVE (5 keys) and per QUOTA.RESERVE in steady state, and their
# ratio (docs/benchmarks.md, issue 19's "≤ 3× a single RESERVE"): callgrind of call(), the
# bench's key shapes (64 tenants; 3 budgets `LIMIT 10^15 TTL 3600000` and 2 window keys
# `WINDOW 10^9 1000` each for MRESERVE, one such budget each for RESERVE), generated ids.
# The commands carry `AT` (test clock) advancing as at full speed (150 MRESERVE or 300
# RESERVE a ms), so that under valgrind's ~100× slowdown the windows still hold what they do
# in the bench: after the warm-up (more than the 1-s window), ids leave as new ones come, and
# most counts land in the newest bucket. The clock starts an hour ahead of the wall, so the
# sweeper (on the wall clock) finds nothing due. Each workload in its own server, both at once.
# usage: scripts/cg-mreserve.sh <release module.so> [n counted, default 20000]
set -e
SO=$(realpath "$1"); N=${2:-20000}
DIR=$(mktemp -d -t cg-mreserve.XXXXXX)
gen() { # kind(M|R) warm n dir
 python3 - "$@" <<'EOF'
import sys, time
kind, warm, n, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def resp(*a):
    out = [b"*%d\r\n" % len(a)]
    for x in a:
        x = str(x).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(x), x))
    return b"".join(out)
t0 = int(time.time() * 1000) + 3_600_000
rate = 150 if kind == "M" else 300
with open(f"{d}/setup", "wb") as f:
    f.write(resp("CONFIG", "SET", "quota.test-clock", "yes"))
    for k in range(64):
        for s in (("b0", "b1", "b2") if kind == "M" else ("q",)):
            f.write(resp("QUOTA.SET", f"bench:{{t{k}}}:{s}", "LIMIT", 10**15, "TTL", 3600000))
        if kind == "M":
            for s in ("rpm", "tpm"):
                f.write(resp("QUOTA.SET", f"bench:{{t{k}}}:{s}", "WINDOW", 10**9, 1000))
def cmd(i):
    k, at = i % 64, t0 + i // rate
    if kind == "M":
        keys = [f"bench:{{t{k}}}:{s}" for s in ("b0", "b1", "b2", "rpm", "tpm")]
        return resp("QUOTA.MRESERVE", 5, *keys, 1000, 1000, 1000, 1, 1000, "AT", at)
    return resp("QUOTA.RESERVE", f"bench:{{t{k}}}:q", 1000, "AT", at)
for name, lo, hi in (("warm", 0, warm), ("run", warm, warm + n)):
    with open(f"{d}/{name}", "wb") as f:
        for i in range(lo, hi):
            f.write(cmd(i))
EOF
}
measure() { # kind warm
 local d=$DIR/$1 port=$((7900 + RANDOM % 500))
 mkdir -p "$d"
 gen "$1" "$2" "$N" "$d"
 valgrind --tool=callgrind --toggle-collect=call --callgrind-out-file="$d/cg.out" \
  redis-server --port $port --dir "$d" --save '' --appendonly no --loadmodule "$SO" \
  >"$d/log" 2>&1 &
 local vp=$!
 for _ in $(seq 200); do redis-cli -p $port ping >/dev/null 2>&1 && break; sleep 0.3; done
 redis-cli -p $port --pipe <"$d/setup" >/dev/null
 redis-cli -p $port --pipe <"$d/warm" >/dev/null
 callgrind_control -z $vp >/dev/null 2>&1
 redis-cli -p $port --pipe <"$d/run" >/dev/null
 redis-cli -p $port shutdown nosave >/dev/null 2>&1 || true
 wait $vp || true
 local total
 total=$(callgrind_annotate --inclusive=yes "$d/cg.out" 2>/dev/null | grep -m1 'PROGRAM TOTALS' |
  awk '{gsub(",","",$1); print $1}')
 echo $((total / N)) >"$d/per_call"
}
measure M 160000 & measure R 320000 & wait
m=$(cat "$DIR/M/per_call"); r=$(cat "$DIR/R/per_call")
echo "instructions per call: MRESERVE (5 keys) $m, RESERVE $r, ratio $(echo "scale=3; $m / $r" | bc)"
rm -rf "$DIR"
