#!/usr/bin/env bash
# What an in-memory commit after every step costs the elastic MNIST example,
# in whole gorun jobs: seconds per epoch of `gorun -np NP --min-np 2
# examples/mnist` committing after every step (--commit-every 1, the
# default) against committing only at the end of each epoch
# (--commit-every 0), in interleaved rounds on this machine, medians. The
# overhead is (every step - epoch ends) / epoch ends. Jobs differ from one
# another by a few per cent, more than a commit costs: BenchmarkElasticStep
# (go test -run '^$' -bench ElasticStep -benchtime 2000x -count 10
# ./examples/mnist) alternates committing and plain steps within one run
# and resolves that; this script checks whole jobs, processes and all.
#
# Usage: bash scripts/commit-overhead.sh [ROUNDS] [NP] [EPOCHS]   (from the repository root)
set -euo pipefail
rounds=${1:-9}
np=${2:-4}
epochs=${3:-10}
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/gorun" ./cmd/gorun
go build -o "$bin/mnist" ./examples/mnist
epoch_seconds() { # commit-every → mean seconds per epoch of one run, the first epoch (warm-up) left out
	local m="$bin/metrics.json"
	rm -f "$m"
	"$bin/gorun" -np "$np" --min-np 2 "$bin/mnist" --progress off --epochs "$epochs" --commit-every "$1" --metrics "$m" >/dev/null
	sed -n 's/.*"epoch_seconds":\([0-9.e+-]*\).*/\1/p' "$m" | tail -n +2 | awk '{s+=$1; n++} END {printf "%.4f\n", s/n}'
}
every=() ends=()
for r in $(seq "$rounds"); do
	every+=("$(epoch_seconds 1)")
	ends+=("$(epoch_seconds 0)")
	echo "round $r: commit every step ${every[-1]} s/epoch, at epoch ends ${ends[-1]} s/epoch"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
m1=$(median "${every[@]}")
m0=$(median "${ends[@]}")
awk -v a="$m1" -v b="$m0" -v np="$np" -v r="$rounds" 'BEGIN {
	printf "np=%d, %d rounds, medians: commit every step %.3f s/epoch, at epoch ends only %.3f s/epoch: overhead %.1f%%\n", np, r, a, b, 100*(a-b)/b }'
