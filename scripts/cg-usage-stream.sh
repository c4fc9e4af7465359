#!/bin/bash
# Instructions per QUOTA.RESERVE+SETTLE cycle, usage stream off and on, in one server
# (docs/benchmarks.md, "The usage stream (issue 21)"): callgrind of call(), 64 budgets of each
# kind, 2000 warm-up cycles on each, then <n> counted on each (callgrind_control -z / -d), the
# commands sent by redis-cli one at a time, COMMAND DOCS subtracted.
# usage: scripts/cg-usage-stream.sh <release module.so> <label> <n cycles per side>
set -e
DIR=${TMPDIR:-/tmp}/cg-usage-stream; mkdir -p $DIR
SO=$(realpath $1); LABEL=$2; N=$3
PORT=$((7600 + RANDOM % 300))
OUT=$DIR/cg-$LABEL.out
rm -f $OUT*
valgrind --tool=callgrind --toggle-collect=call --callgrind-out-file=$OUT redis-server --port $PORT --loadmodule $SO sweep-effort 0 --save '' --appendonly no >$DIR/cg-$LABEL.log 2>&1 &
VP=$!
for i in $(seq 100); do redis-cli -p $PORT ping >/dev/null 2>&1 && break; kill -0 $VP || { echo "server died"; exit 1; }; sleep 0.3; done
for k in $(seq 0 63); do
 echo "QUOTA.SET bench:q:$k LIMIT 1000000000000000 TTL 3600000"
 echo "QUOTA.SET bench:s:$k LIMIT 1000000000000000 TTL 3600000 STREAM bench:u:$k STREAMMAXLEN 100000"
done | redis-cli -p $PORT >/dev/null
cycles() { # prefix start count
 for i in $(seq $2 $(($2+$3-1))); do k=$((i % 64)); echo "QUOTA.RESERVE $1:$k 1 ID c$i"; echo "QUOTA.SETTLE $1:$k c$i 1"; done
}
cycles bench:q 0 2000 | redis-cli -p $PORT >/dev/null
cycles bench:s 0 2000 | redis-cli -p $PORT >/dev/null
cycles bench:q 100000 $N > $DIR/q.txt; cycles bench:s 100000 $N > $DIR/s.txt
callgrind_control -z $VP >/dev/null
redis-cli -p $PORT < $DIR/q.txt >/dev/null
callgrind_control -d off $VP >/dev/null
redis-cli -p $PORT < $DIR/s.txt >/dev/null
callgrind_control -d on $VP >/dev/null
redis-cli -p $PORT xlen bench:u:0
redis-cli -p $PORT shutdown nosave >/dev/null 2>&1 || true
wait $VP || true
for f in $OUT.1 $OUT.2; do
 part=$(grep -m1 '^desc: Trigger' $f | awk '{print $NF}')
 TOTAL=$(callgrind_annotate --inclusive=yes $f 2>/dev/null | grep -E ' call \[|:call \[' | head -1 | awk '{gsub(",","",$1); print $1}')
 DOCS=$(callgrind_annotate --inclusive=yes $f 2>/dev/null | grep -E 'commandDocsCommand' | head -1 | awk '{gsub(",","",$1); print $1}')
 echo "$LABEL stream $part: call() $TOTAL docs ${DOCS:-0} per cycle $(( (TOTAL - ${DOCS:-0}) / N ))  ($f)"
done
