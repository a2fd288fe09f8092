#!/usr/bin/env bash
# slowlink.sh: gorun bench across network namespaces joined by 1 Gbit/s links.
#
#   sudo scripts/slowlink.sh [NP] [RATE] [SIZES] [CODECS] [ROUNDS]
#   e.g. scripts/slowlink.sh 4 1gbit 64M "none fp16 int8" 3
#
# Each round runs every codec once, one after another, so that on a shared
# machine the codecs see the same conditions; the summary gives each codec's
# median time over the rounds and its speed-up over none (per size).
#
# Makes NP network namespaces ("hosts") and one "switch" namespace with a
# bridge; each host is joined to the switch by a veth pair whose two ends are
# shaped to RATE with tc tbf, so every host's uplink and downlink is a RATE
# link. Ranks are started by hand in their namespaces with torchrun-style
# variables (rank 0 hosts the rendezvous), each on its own "host", so ring
# data crosses the shaped links over TLS (tcp-tls links; set
# GORUN_DATA_PLANE=libp2p or plaintext to compare). Traffic stays inside the
# namespaces. Everything is removed on exit. Needs root and iproute2.
set -euo pipefail
np=${1:-4}
rate=${2:-1gbit}
sizes=${3:-64M}
codecs=${4:-none fp16 int8}
rounds=${5:-1}
here=$(cd "$(dirname "$0")/.." && pwd)
tag=gr$$
net=10.77.$(( $$ % 200 )).
bin=$(mktemp -d)
cleanup() {
  for i in $(seq 0 $((np - 1))); do
    ip netns pids "$tag-h$i" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$tag-h$i" 2>/dev/null || true
  done
  ip netns del "$tag-sw" 2>/dev/null || true
  rm -rf "$bin"
}
trap cleanup EXIT

(cd "$here" && go build -o "$bin/gorun" ./cmd/gorun)

ip netns add "$tag-sw"
ip -n "$tag-sw" link add br0 type bridge
ip -n "$tag-sw" link set br0 up
ip -n "$tag-sw" link set lo up
for i in $(seq 0 $((np - 1))); do
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
results=$bin/results
for round in $(seq 1 "$rounds"); do
for codec in $codecs; do
  extra=()
  [ "$codec" != none ] && extra=(--compression "$codec")
  pids=()
  for i in $(seq $((np - 1)) -1 0); do
    ip netns exec "$tag-h$i" env RANK=$i WORLD_SIZE=$np LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      MASTER_ADDR="${net}1" MASTER_PORT=29500 GORUN_JOB_KEY="$key" GORUN_LISTEN_IP="$net$((i + 1))" \
      GORUN_TIMEOUT=120s "$bin/gorun" bench-worker --sizes "$sizes" --json "${extra[@]}" \
      > "$bin/out.$i" 2>&1 &
    pids+=($!)
  done
  status=0
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  if [ $status -ne 0 ]; then
    echo "codec $codec failed:" >&2
    tail -n 5 "$bin"/out.* >&2
    exit 1
  fi
  echo "# round $round: np=$np rate=$rate codec=$codec"
  grep '^{' "$bin/out.0" | tee -a "$results"
done
done
# Summary: median time per codec and size, and the speed-up over none.
echo "# summary over $rounds round(s): codec bytes median_s speedup_vs_none"
sed -E 's/.*"bytes":([0-9]+).*"time_us":([0-9.]+).*"compression":"([a-z0-9]+)".*/\3 \1 \2/; t; s/.*"bytes":([0-9]+).*"time_us":([0-9.]+).*/none \1 \2/' "$results" |
  sort -k1,1 -k2,2n -k3,3g |
  awk '{ k = $1 " " $2; t[k] = t[k] " " $3; n[k]++ }
       END {
         for (k in t) {
           m = split(substr(t[k], 2), v, " "); med[k] = (v[int((m + 1) / 2)] + v[int(m / 2) + 1]) / 2
         }
         for (k in med) {
           split(k, kb, " "); base = med["none " kb[2]]
           printf "%s %s %.3f %s\n", kb[1], kb[2], med[k] / 1e6, (base ? sprintf("%.2fx", base / med[k]) : "-")
         }
       }' | sort -k2,2n -k4,4r
