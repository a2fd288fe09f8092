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
# ranks on 2 cores, 45 % each leaves a little for the rest of the host.
# The quotas are enforced with a period of 10 ms, so that a throttled rank
# is stopped often and briefly rather than for tens of milliseconds.
#
# The example's default model is too small for this: its steps are mostly
# fixed costs (the optimizer's update, the allreduce), which no split of the
# samples moves. So it trains the CNN with a global batch of 256 (the
# flags after -- replace these).
#
# Reported per way: samples/s over the epochs after the first (the first
# has the start and the steps before the first re-plan), the final test
# accuracy, and, for balanced runs, the ranks' compute rates as the
# Reducer measured them (samples/s of compute, collectives left out) and
# the shares at the end. The summary gives the medians over the rounds:
# for balanced runs the sum of the ranks' compute rates (what the job
# would do if no rank ever waited and the allreduce cost nothing) and the
# efficiency, samples/s over that sum; the throttled job's throughput
# against the unbalanced job's, against the even one's and against the
# even one's scaled by the throttled ranks' summed speed (the even job's
# throughput × the sum of the throttled job's rates / the even job's), and
# its efficiency against the even one's.
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
period=10000
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

(cd "$here" && go build -o "$work/gorun" ./cmd/gorun && go build -o "$work/mnist" ./examples/mnist)
# The rank program: a rank moves itself into its cgroup before it becomes
# the example (its threads are created after, inside).
cat > "$work/rank" <<EOF
#!/bin/sh
echo \$\$ > "$root/gorun-balance-$$-rank\$GORUN_RANK/cgroup.procs"
exec "$work/mnist" "\$@"
EOF
chmod +x "$work/rank"

# run WAY ROUND: one training run; appends "WAY samples_per_s acc rates shares" to results.
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
    END { printf "%s %.1f %.2f %s %s\n", way, n / t, 100 * acc, rates, shares }' "$m" | tee -a "$work/results"
}

ways=(even throttled unbalanced)
for round in $(seq 1 "$rounds"); do
  echo "# round $round: every rank at $base % of a CPU, rank 3 throttled to $slow % of that"
  for i in 0 1 2; do
    run "${ways[$(( (i + round - 1) % 3 ))]}" "$round"
  done
done

echo "# medians over $rounds round(s): way samples/s test_acc% sum_of_compute_rates efficiency"
awk '
  function median(list,   n, v, i, j, x) {
    n = split(list, v, " ")
    for (i = 2; i <= n; i++) { x = v[i]; for (j = i - 1; j > 0 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  { rate[$1] = rate[$1] " " $2; acc[$1] = acc[$1] " " $3
    if ($4 != "-") {
      rs = $4; gsub(/[][]/, "", rs); n = split(rs, r, ",")
      sum = 0; fast = 0; for (i = 1; i <= n; i++) { sum += r[i]; if (r[i] + 0 > fast) fast = r[i] + 0 }
      total[$1] = total[$1] " " sum; eff[$1] = eff[$1] " " $2 / sum
      if ($1 == "throttled") rel = rel " " r[4] / fast } }
  END {
    split("even throttled unbalanced", ways, " ")
    for (i = 1; i <= 3; i++) { w = ways[i]
      printf "%-10s %8.1f %6.2f %8s %6s\n", w, median(rate[w]), median(acc[w]),
        (w in total ? sprintf("%.0f", median(total[w])) : "-"), (w in eff ? sprintf("%.3f", median(eff[w])) : "-") }
    e = median(rate["even"]); b = median(rate["throttled"]); u = median(rate["unbalanced"])
    if (rel != "") printf "rank 3 at %.2fx the fastest rank when throttled (median)\n", median(rel)
    printf "throttled, balanced: %.2fx the unbalanced job, %.3f of the even job'"'"'s throughput", b / u, b / e
    if (("throttled" in total) && ("even" in total)) {
      c = median(total["throttled"]) / median(total["even"])
      printf " (its ranks'"'"' summed speed: %.3f of the even job'"'"'s, so %.3f of that capacity)", c, b / (e * c)
    }
    if (("throttled" in eff) && ("even" in eff))
      printf ", %.3f of its efficiency (samples/s over the sum of the ranks'"'"' compute rates)", median(eff["throttled"]) / median(eff["even"])
    printf "\ntest accuracy: throttled balanced %.2f%%, even %.2f%% (%+.2f pt); unbalanced %.2f%%\n",
      median(acc["throttled"]), median(acc["even"]), median(acc["throttled"]) - median(acc["even"]), median(acc["unbalanced"])
  }' "$work/results"
