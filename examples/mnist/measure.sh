#!/usr/bin/env bash
# Reproduces the accuracy and speed tables of README.md (examples/mnist).
# Usage: bash examples/mnist/measure.sh [fashion-dir]   (from the repository root)
# Speed figures are the best of 3 runs: the machine may be shared.
set -euo pipefail
FASHION=${1:-/usr/share/datasets/fashion-mnist}
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/gorun" ./cmd/gorun
go build -o "$bin/mnist" ./examples/mnist
run() { # run NP ARGS...: prints the final accuracy and mean seconds per epoch
	local np=$1; shift
	if [ "$np" = 1 ]; then "$bin/mnist" --progress off "$@"; else "$bin/gorun" -np "$np" "$bin/mnist" --progress off "$@"; fi |
		sed -n 's/^\(\[0\] \)\{0,1\}final: test accuracy \([0-9.]*\)% .*, \([0-9.]*\) s per epoch$/\2 \3/p'
}
echo "== accuracy, embedded 8k/2k digits, 10 epochs, SGD (test accuracy %, s/epoch)"
echo "1 rank,  global batch 64:          $(run 1)"
echo "2 ranks, global batch 64 (2 × 32): $(run 2)"
echo "3 ranks, global batch 64 (21-22):  $(run 3)"
echo "4 ranks, global batch 64 (4 × 16): $(run 4)"
echo "2 ranks, global batch 64, int8:    $(run 2 --compression int8)"
echo "4 ranks, global batch 64, int8:    $(run 4 --compression int8)"
echo "2 ranks, batch 64 (global 128):    $(run 2 --batch 64)"
echo "2 ranks, batch 64, int8:           $(run 2 --batch 64 --compression int8)"
echo "4 ranks, batch 64 (global 256):    $(run 4 --batch 64)"
echo "1 rank,  --hidden 256,128:         $(run 1 --hidden 256,128)"
if [ -d "$FASHION" ]; then
	echo "== Fashion-MNIST 60k/10k, 5 epochs, 1 rank, batch 64: $(run 1 --data "$FASHION" --epochs 5)"
	echo "== speed, Fashion-MNIST, per-rank batch 64, seconds per epoch (best of 3, 2 epochs each)"
	for np in 1 2 4; do
		best=$(for _ in 1 2 3; do run "$np" --data "$FASHION" --epochs 2 --batch 64 | cut -d' ' -f2; done | sort -n | head -1)
		echo "$np rank(s): $best s/epoch"
	done
fi
