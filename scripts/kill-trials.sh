#!/usr/bin/env bash
# kill-trials.sh [TRIALS] [NP] [STEPS] [EVERY]: the kill/resume experiment of
# issue 6. Trains internal/testenv/progs/ckptprog (linear regression with momentum, a
# checkpoint every EVERY steps) under `gorun -np NP --max-restarts 3`, once
# uninterrupted and then TRIALS times with a random rank sending itself
# SIGKILL before a random step on the first launch, and counts the trials
# whose final parameters are bitwise-identical to the uninterrupted run's.
# Odd trials kill the rank at the start of the step; even trials kill it at
# a random instant within WITHIN (default 50ms) after the step starts, which
# lands anywhere, often in the middle of a checkpoint save.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
trials=${1:-20} np=${2:-4} steps=${3:-200} every=${4:-10} seed=${SEED:-11} within=${WITHIN:-50ms}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/gorun" ./cmd/gorun
go build -o "$work/ckptprog" ./internal/testenv/progs/ckptprog

train() { # name [kill]
  local name=$1 kill=${2:-}
  env CKPTPROG_DIR="$work/$name" CKPTPROG_OUT="$work/$name.hex" CKPTPROG_STEPS="$steps" \
    CKPTPROG_EVERY="$every" CKPTPROG_SEED="$seed" ${kill:+CKPTPROG_KILL=$kill} \
    "$work/gorun" -np "$np" --max-restarts 3 "$work/ckptprog" >"$work/$name.log" 2>&1
}

train reference
echo "reference: $(grep -h 'done:' "$work/reference.log") params $(cut -c1-32 "$work/reference.hex")..."
same=0 resumed=0 interrupted=0
for i in $(seq 1 "$trials"); do
  victim=$((RANDOM % np)) at=$((1 + RANDOM % (steps - 1)))
  kill="$victim:$at" what="before step $at"
  if [ $((i % 2)) = 0 ]; then
    kill="$victim:$at:$within"
  fi
  if ! train "t$i" "$kill"; then
    echo "trial $i: rank $victim killed ($kill): job FAILED"; tail -5 "$work/t$i.log"; continue
  fi
  what=$(sed -n 's/.*SIGKILL \(.*\)$/\1/p' "$work/t$i.log" | head -1)
  from=$(sed -n 's/.*resumed from the checkpoint of step \([0-9]*\).*/\1/p' "$work/t$i.log" | head -1)
  [ -n "$from" ] && resumed=$((resumed + 1))
  if cmp -s "$work/reference.hex" "$work/t$i.hex"; then
    same=$((same + 1)); verdict=identical
  else
    verdict=DIFFERENT
  fi
  # A save the kill interrupted leaves an uncommitted step directory, which
  # the resumed job's next save of that step replaces (and logs).
  midsave=""
  grep -q "replacing existing" "$work/t$i.log" && { midsave=" (the kill interrupted a save)"; interrupted=$((interrupted + 1)); }
  echo "trial $i: rank $victim killed ${what:-?}$midsave, resumed from step ${from:-none (no checkpoint yet: fresh start)}: $verdict"
done
echo "$same of $trials trials ended bitwise-identical to the uninterrupted run ($resumed resumed from a checkpoint, $interrupted kills interrupted a save; np=$np, $steps steps, checkpoint every $every)"
[ "$same" -eq "$trials" ]
