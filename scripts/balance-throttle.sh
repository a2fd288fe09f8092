#!/usr/bin/env bash
# balance-throttle.sh: load balancing against a rank throttled by a CPU quota.
#
#   sudo scripts/balance-throttle.sh [ROUNDS] [BASE_PERCENT] [SLOW_PERCENT] [EPOCHS] [-- MNIST FLAGS...]
#   e.g. sudo scripts/balance-throttle.sh 5 45 50 5
#
# Trains the MNIST example on 4 ranks of this host (gorun -np 4), each rank
# in a cgroup of its own whose CPU quota is BASE_PERCENT of one CPU, three
# ways, one after another in every round, the order rotated from round to
# round so that all three see the same load of a shared machine:
#
#   even       every rank at BASE_PERCENT, shares balanced (the default)
#   throttled  rank 3's quota cut to SLOW_PERCENT of the others', balanced
#   unbalanced rank 3 throttled the same way, --balance=false
#
# A quota per rank makes each rank's speed its own: on a host with fewer
# cores than ranks, the CPU a throttled rank leaves would otherwise go to
# the others, and the job would lose less than the rank's share. With 4
# ranks on 2 cores, 45 % each leaves a little for the rest of the host;
# on a host that other jobs load, a quota below the share of a CPU each
# rank would get anyway (say 12 %) still sets the ranks' speeds. The
# quotas are enforced with a period of 20 ms (PERIOD_US=20000; the kernel
# takes no quota below 1 ms), so that a throttled rank is stopped often
# and briefly rather than for a whole 100 ms period: a rank stopped by its
# quota stalls every collective it is part of until its next period.
#
# The example's default model is too small for this: its steps are mostly
# fixed costs (the optimizer's update, the allreduce), which no split of the
# samples moves. So it trains the CNN with a global batch of 256 (the
# flags after -- replace these).
#
# Reported per way: samples/s over the epochs after the first (the first
# has the start and the steps before the first re-plan), the final test
# accuracy, for balanced runs the ranks' compute rates as the Reducer
# measured them (samples/s of compute, collectives left out) and the
# shares at the end, and the host's load. The summary gives the medians
# over the rounds; the throttled, balanced job's throughput against the
# unbalanced job's and the even one's; and against what the throttled
# ranks can do together: the even job's throughput × (3 + s) / 4, where s
# is rank 3's compute rate over the other ranks' mean in the throttled
# run (ratios within one run, which the host's load moves little).
#
# Needs root and cgroup v1's cpu controller at /sys/fs/cgroup/cpu (cgroup
# v2's cpu.max at /sys/fs/cgroup otherwise). Everything is removed on exit.
set -euo pipefail
rounds=${1:-5}
base=${2:-45}
slow=${3:-50}
epochs=${4:-5}
shift $(( $# < 4 ? $# : 4 ))
[ "${1:-}" = "--" ] && shift
flags=("$@")
[ ${#flags[@]} -eq 0 ] && flags=(--model cnn --global-batch 256)
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
period=${PERIOD_US:-20000}
if [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
  root=/sys/fs/cgroup/cpu v1=1
else
  root=/sys/fs/cgroup v1=0
fi
cgs=()
for r in 0 1 2 3; do
  cg=$root/gorun-balance-$$-rank$r
  mkdir "$cg"
  cgs+=("$cg")
done
# quota RANK PERCENT: rank's cgroup may use PERCENT of one CPU.
quota() {
  local us=$(( period * $2 / 100 ))
  if [ $v1 = 1 ]; then
    echo $period > "${cgs[$1]}/cpu.cfs_period_us"
    echo $us > "${cgs[$1]}/cpu.cfs_quota_us"
  else
    echo "$us $period" > "${cgs[$1]}/cpu.max"
  fi
}
cleanup() {
  # The ranks have exited: the cgroups are empty and can go.
  for cg in "${cgs[@]}"; do rmdir "$cg" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM # and so through cleanup

(cd "$here" && go build -o "$work/gorun" ./cmd/gorun && go build -o "$work/mnist" ./examples/mnist)
# The rank program: a rank moves itself into its cgroup before it becomes
# the example (its threads are created after, inside).
cat > "$work/rank" <<EOF
#!/bin/sh
echo \$\$ > "$root/gorun-balance-$$-rank\$GORUN_RANK/cgroup.procs"
exec "$work/mnist" "\$@"
EOF
chmod +x "$work/rank"

# run WAY ROUND: one training run; appends "WAY samples_per_s acc rates
# shares load" to results, load being the host's load average over the
# minute before the run ended (other jobs on a shared host show there).
run() {
  local way=$1 round=$2 m=$work/metrics.$1.$2 bal=()
  for r in 0 1 2 3; do quota $r "$base"; done
  case $way in
    throttled) quota 3 $(( base * slow / 100 )) ;;
    unbalanced) quota 3 $(( base * slow / 100 )); bal=(--balance=false) ;;
  esac
  "$work/gorun" -np 4 "$work/rank" --epochs "$epochs" --progress off --metrics "$m" \
    "${flags[@]}" "${bal[@]}" > "$work/out.$way.$round" 2>&1 || {
    echo "$way run failed:" >&2; tail -n 20 "$work/out.$way.$round" >&2; exit 1; }
  # Epochs after the first: their samples over their seconds.
  awk -v way="$way" '
    { match($0, /"epoch":[0-9]+/); e = substr($0, RSTART + 8, RLENGTH - 8) + 0
      match($0, /"epoch_seconds":[0-9.e+-]+/); s = substr($0, RSTART + 16, RLENGTH - 16) + 0
      match($0, /"steps":[0-9]+/); st = substr($0, RSTART + 8, RLENGTH - 8) + 0
      match($0, /"global_batch":[0-9]+/); g = substr($0, RSTART + 15, RLENGTH - 15) + 0
      match($0, /"test_acc":[0-9.e+-]+/); acc = substr($0, RSTART + 11, RLENGTH - 11) + 0
      rates = "-"; if (match($0, /"compute_rates":\[[^]]*\]/)) rates = substr($0, RSTART + 16, RLENGTH - 16)
      shares = "-"; if (match($0, /"shares":\[[^]]*\]/)) shares = substr($0, RSTART + 9, RLENGTH - 9)
      if (e > 1) { n += st * g; t += s } }
    END { printf "%s %.1f %.2f %s %s ", way, n / t, 100 * acc, rates, shares }' "$m" | tee -a "$work/results"
  cut -d" " -f1 /proc/loadavg | tee -a "$work/results"
}

ways=(even throttled unbalanced)
for round in $(seq 1 "$rounds"); do
  echo "# round $round: every rank at $base % of a CPU, rank 3 throttled to $slow % of that"
  for i in 0 1 2; do
    run "${ways[$(( (i + round - 1) % 3 ))]}" "$round"
  done
done

echo "# medians over $rounds round(s): way samples/s test_acc%"
awk '
  function median(list,   n, v, i, j, x) {
    n = split(list, v, " ")
    for (i = 2; i <= n; i++) { x = v[i]; for (j = i - 1; j > 0 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  { rate[$1] = rate[$1] " " $2; acc[$1] = acc[$1] " " $3
    if ($1 == "throttled" && $4 != "-") {
      rs = $4; gsub(/[][]/, "", rs); split(rs, r, ",")
      rel = rel " " r[4] / ((r[1] + r[2] + r[3]) / 3) } }
  END {
    split("even throttled unbalanced", ways, " ")
    for (i = 1; i <= 3; i++) printf "%-10s %8.1f %6.2f\n", ways[i], median(rate[ways[i]]), median(acc[ways[i]])
    e = median(rate["even"]); b = median(rate["throttled"]); u = median(rate["unbalanced"])
    printf "throttled, balanced: %.2fx the unbalanced job; %.3f of the even job'"'"'s throughput\n", b / u, b / e
    if (rel != "") {
      s = median(rel); c = (3 + s) / 4
      printf "rank 3 computes at %.2fx the others'"'"' speed (median), so the ranks'"'"' summed speed is %.3f of the even job'"'"'s:\n", s, c
      printf "the throttled, balanced job reaches %.3f of it (the unbalanced one %.3f)\n", b / (e * c), u / (e * c)
    }
    printf "test accuracy: throttled balanced %.2f%%, even %.2f%% (%+.2f pt); unbalanced %.2f%%\n",
      median(acc["throttled"]), median(acc["even"]), median(acc["throttled"]) - median(acc["even"]), median(acc["unbalanced"])
  }' "$work/results"
