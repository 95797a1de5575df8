#!/bin/sh
# bench/trainer.sh [BUILD] [STEPS]: tokens per second of the CPU MoE trainer
# (examples/trainer) on four MPI processes, kiln in each stage's real budget
# against keeping every activation in a 1 GiB arena, the same spikes in both
# (docs/trainer.md). Prints one line per run and the ratio. Timing excludes
# the first step.
set -eu
BUILD=${1:-build}
STEPS=${2:-30}
SPIKES="--spike 4,11,19,26:1.0:0+1 --spike 7,15,23:0.8:5"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$BUILD/kilnc" compile examples/trainer/trainer.yaml -o "$tmp/plan.kiln" >/dev/null
root=""
[ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
run() {
	mpirun --oversubscribe $root -np 4 "$BUILD/kiln-trainer" --plan "$tmp/plan.kiln" --quiet \
		--steps "$STEPS" $SPIKES "$@" | sed -n 's/.* \([0-9.]*\) tokens\/s after the first step/\1/p'
}
# Four processes share the machine's cores, so single runs are noisy: the
# two runs alternate REPEAT times and the medians are compared.
REPEAT=${REPEAT:-3}
keeps="" kilns=""
i=0
while [ "$i" -lt "$REPEAT" ]; do
	keep=$(run --policy keep --arena 1G)
	kiln=$(run --policy kiln)
	if [ -z "$keep" ] || [ -z "$kiln" ]; then
		echo "bench/trainer.sh: a trainer run failed (keep: '$keep', kiln: '$kiln')" >&2
		exit 1
	fi
	keeps="$keeps $keep" kilns="$kilns $kiln"
	i=$((i + 1))
done
median() { echo "$@" | tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
keep=$(median $keeps)
kiln=$(median $kilns)
echo "trainer: $STEPS steps of 2048 tokens, 4 ranks (2 stages x 2 EP), spikes to 2x on 4 steps; median of $REPEAT runs each"
printf "  %-50s %8s tokens/s  (runs:%s)\n" "keep everything, 1 GiB arena" "$keep" "$keeps"
printf "  %-50s %8s tokens/s  (runs:%s)\n" "kiln, arena = stage capacity - static (3.48 MiB)" "$kiln" "$kilns"
awk -v a="$kiln" -v b="$keep" 'BEGIN { printf "  kiln / keep-everything: %.3f\n", a / b }'
