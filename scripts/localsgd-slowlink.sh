#!/usr/bin/env bash
# localsgd-slowlink.sh: local SGD against every-step allreduce over a slow link.
#
#   sudo scripts/localsgd-slowlink.sh [ROUNDS] [RATE] [EPOCHS] [KS] [CODECS]
#   e.g. sudo scripts/localsgd-slowlink.sh 3 100mbit 10 "1 4 8 16" "none int8"
#
# Trains the MNIST example on 2 network-namespace "hosts" × 2 ranks, every
# host's link shaped to RATE with tc tbf (as slowlink.sh does), once for
# every K in KS (--sync-every K: 1 is the allreduce of the gradients at
# every step, K > 1 local SGD averaging the models every K steps) and every
# codec in CODECS (--compression: of the gradients at K = 1, of the deltas
# at K > 1), each round running every combination one after another, so
# that they see the same load of a shared machine. The test set is
# evaluated every 16 steps (--eval-every 16, right after an average for K
# dividing 16), and the time of training (evaluations left out) when the
# test accuracy first reaches 95 % is taken from those lines. The shares
# stay even (--balance=false), local SGD's as every-step allreduce's, so
# that the runs differ in their synchronisation only.
#
# Reported per run: that time (or "-" if never) and the step it came at,
# the final test accuracy after EPOCHS epochs, and the bytes rank 0 sent. The summary gives the
# medians over the rounds, each K's speed-up to 95 % over K = 1 with the
# same codec, and its final accuracy against K = 1's.
#
# Ranks are started by hand in their namespaces with torchrun-style
# variables (rank 0 hosts the rendezvous); the two ranks of a host talk
# over shared memory, the hosts over TLS across the shaped link. Needs
# root and iproute2; everything is removed on exit.
set -euo pipefail
rounds=${1:-3}
rate=${2:-100mbit}
epochs=${3:-10}
ks=${4:-1 4 8 16}
codecs=${5:-none int8}
here=$(cd "$(dirname "$0")/.." && pwd)
tag=gl$$
net=10.78.$(( $$ % 200 )).
work=$(mktemp -d)
hosts=2
cleanup() {
  for i in $(seq 0 $((hosts - 1))); do
    ip netns pids "$tag-h$i" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$tag-h$i" 2>/dev/null || true
  done
  ip netns del "$tag-sw" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM # and so through cleanup

(cd "$here" && go build -o "$work/mnist" ./examples/mnist)

ip netns add "$tag-sw"
ip -n "$tag-sw" link add br0 type bridge
ip -n "$tag-sw" link set br0 up
ip -n "$tag-sw" link set lo up
for i in $(seq 0 $((hosts - 1))); do
  h=$tag-h$i
  ip netns add "$h"
  ip link add "v$tag$i" netns "$h" type veth peer name "p$i" netns "$tag-sw"
  ip -n "$h" link set lo up
  ip -n "$h" addr add "$net$((i + 1))/24" dev "v$tag$i"
  ip -n "$h" link set "v$tag$i" up
  ip -n "$tag-sw" link set "p$i" master br0 up
  # Shape both directions of the host's link.
  ip netns exec "$h" tc qdisc add dev "v$tag$i" root tbf rate "$rate" burst 256kb latency 50ms
  ip netns exec "$tag-sw" tc qdisc add dev "p$i" root tbf rate "$rate" burst 256kb latency 50ms
done

key=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
# run K CODEC ROUND: one training run of 4 ranks; appends
# "K codec seconds_to_95 step_of_95 final_acc bytes load" to results, load
# being the host's load average over the minute before the run ended.
run() {
  local k=$1 codec=$2 round=$3 out=$work/out.$1.$2.$3 pids=() status=0
  for r in 3 2 1 0; do
    local h=$(( r / 2 ))
    ip netns exec "$tag-h$h" env RANK=$r WORLD_SIZE=4 LOCAL_RANK=$(( r % 2 )) LOCAL_WORLD_SIZE=2 \
      MASTER_ADDR="${net}1" MASTER_PORT=29500 GORUN_JOB_KEY="$key" GORUN_LISTEN_IP="$net$((h + 1))" \
      GORUN_TIMEOUT=120s "$work/mnist" --epochs "$epochs" --progress off --eval-every 16 \
      --sync-every "$k" --compression "$codec" --balance=false > "$out.$r" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  if [ $status -ne 0 ]; then
    echo "K=$k $codec failed:" >&2
    tail -n 5 "$out".* >&2
    exit 1
  fi
  awk -v k="$k" -v codec="$codec" '
    /^eval: / && t == "" { a = $0; sub(/.*test accuracy /, "", a); sub(/%.*/, "", a)
      if (a + 0 >= 95) { t = $0; sub(/.*\), /, "", t); sub(/ s of training.*/, "", t); s = $3 } }
    /^final: test accuracy/ { f = $4; sub(/%/, "", f) }
    /^final: bytes sent per rank/ { b = $0; sub(/.*rank 0 [0-9.]+ [kMG]?B → /, "", b); sub(/,.*/, "", b); gsub(/ /, "", b) }
    END { printf "%s %s %s %s %s %s ", k, codec, (t == "" ? "-" : t), (t == "" ? "-" : s), f, b }' "$out.0" | tee -a "$work/results"
  cut -d" " -f1 /proc/loadavg | tee -a "$work/results"
}

for round in $(seq 1 "$rounds"); do
  echo "# round $round: 2 hosts × 2 ranks, links at $rate; K codec s_to_95% step_of_95% final_acc% sent_by_rank0 load"
  for codec in $codecs; do
    for k in $ks; do
      run "$k" "$codec" "$round"
    done
  done
done

echo "# medians over $rounds round(s): K codec s_to_95% speedup_vs_K1 step_of_95% final_acc% vs_K1_pt"
awk '
  function median(list,   n, v, i, j, x) {
    n = split(list, v, " ")
    for (i = 2; i <= n; i++) { x = v[i]; for (j = i - 1; j > 0 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  { key = $1 " " $2; if ($3 != "-") { t[key] = t[key] " " $3; st[key] = st[key] " " $4 } else miss[key]++
    a[key] = a[key] " " $5; keys[key] = 1 }
  END {
    for (key in keys) {
      split(key, kc, " "); base = "1 " kc[2]
      mt = (key in t) ? median(t[key]) : -1; bt = (base in t) ? median(t[base]) : -1
      printf "%s %s %s %s %s %.2f %+.2f%s\n", kc[1], kc[2], (mt < 0 ? "-" : sprintf("%.2f", mt)),
        (mt > 0 && bt > 0 ? sprintf("%.2fx", bt / mt) : "-"), (key in st ? median(st[key]) : "-"),
        median(a[key]), median(a[key]) - median(a[base]),
        (miss[key] ? sprintf(" (%d run(s) never reached 95%%)", miss[key]) : "")
    }
  }' "$work/results" | sort -k2,2 -k1,1n
