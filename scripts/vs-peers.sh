#!/usr/bin/env bash
# vs-peers.sh: gorun's allreduce against OpenMPI (TCP and shared memory) and
# Gloo on this machine, in interleaved rounds, as the ratios issue 14 asks for.
#
#   scripts/vs-peers.sh [ROUNDS] [NPS] [SIZES]     e.g.  scripts/vs-peers.sh 3 "2 4" 4,65536,1048576,67108864
#
# Each round runs, for every NP, ../shared/bench/peers/run-peers.sh and then
# gorun bench with the same sizes, so every system sees the same conditions;
# the summary is the median over the rounds of each system's time (4 bytes)
# and busbw (larger sizes), and gorun's ratio to each peer. Raw lines are kept
# in $OUT (default a temp directory). Needs root on first use (run-peers.sh
# installs OpenMPI and PyTorch from Debian).
set -euo pipefail
rounds=${1:-3}
nps=${2:-2 4}
sizes=${3:-4,65536,1048576,67108864}
here=$(cd "$(dirname "$0")/.." && pwd)
peers=${PEERS:-$here/../shared/bench/peers/run-peers.sh}
out=${OUT:-$(mktemp -d)}
bin=$out/gorun
(cd "$here" && go build -o "$bin" ./cmd/gorun)
for r in $(seq 1 "$rounds"); do
  for np in $nps; do
    echo "round $r/$rounds np=$np ..." >&2
    "$peers" "$np" "$sizes" >>"$out/peers.txt"
    "$bin" bench -np "$np" --sizes "$sizes" --json |
      sed "s/^/GORUN round=$r /" >>"$out/gorun.txt"
  done
done
echo "raw results: $out" >&2
python3 - "$out" <<'PY'
import json, re, statistics, sys, collections
out = sys.argv[1]
t = collections.defaultdict(list)   # (system, np, bytes) -> [(us, busbw)]
algo = {}
for line in open(out + "/peers.txt"):
    if not line.startswith("RESULT"):
        continue
    f = dict(kv.split("=", 1) for kv in line.split()[1:])
    name = {"tcp": "TCP", "shm": "shm"}.get(f["mode"], f["mode"])
    key = ("OpenMPI " + name if f["system"].lower().startswith(("openmpi", "mpi")) else f["system"].capitalize() + " " + name)
    t[(key, int(f["np"]), int(f["bytes"]))].append((float(f["med_us"]), float(f["busbw_GBps"])))
for line in open(out + "/gorun.txt"):
    j = json.loads(line.split(" ", 2)[2])
    t[("gorun", j["np"], j["bytes"])].append((j["time_us"], j["busbw_gbps"]))
    algo[(j["np"], j["bytes"])] = j.get("algorithm", "")
systems = sorted({k[0] for k in t if k[0] != "gorun"}) + ["gorun"]
def med(sys_, np, b, i):
    v = t.get((sys_, np, b))
    return statistics.median(x[i] for x in v) if v else float("nan")
print("| np | measure | " + " | ".join(systems) + " | gorun algorithm | gorun vs " + " / ".join(s for s in systems if s != "gorun") + " |")
print("|" + "---|" * (len(systems) + 4))
for np in sorted({k[1] for k in t}):
    for b in sorted({k[2] for k in t if k[1] == np}):
        lat = b <= 64
        i = 0 if lat else 1
        cells, ratios = [], []
        g = med("gorun", np, b, i)
        for s in systems:
            v = med(s, np, b, i)
            cells.append(f"{v:.1f} µs" if lat else f"{v:.2f} GB/s")
            if s != "gorun":
                ratios.append(f"{v / g:.2f}×" if lat else f"{g / v:.2f}×")
        what = f"{b} B latency" if lat else f"busbw at {b // 1024} KiB" if b < 1 << 20 else f"busbw at {b >> 20} MiB"
        print(f"| {np} | {what} | " + " | ".join(cells) + f" | {algo.get((np, b), '')} | " + " / ".join(ratios) + " |")
print(f"\n{len(set(x for x in open(out + '/gorun.txt').read().split() if x.startswith('round=')))} round(s); medians; ratios > 1 mean gorun is better (peer time / gorun time for latency, gorun busbw / peer busbw otherwise).")
PY
