#!/bin/sh
# fuzz/run.sh: runs one fuzz target for a fixed time and fails on any finding
# (crash, sanitizer report, leak, timeout, out-of-memory). Used by `make fuzz`;
# docs/fuzzing.md has the details.
#
#   fuzz/run.sh BUILD_DIR TARGET SECONDS SEED_DIR...
#
# New interesting inputs go to BUILD_DIR/corpus/TARGET (kept between runs, so
# each run goes on from the last); findings go to BUILD_DIR/crashes/ as
# TARGET-crash-<sha1> (or -leak-, -timeout-, -oom-); libFuzzer's output goes
# to BUILD_DIR/TARGET.log. Run from the repository root: the YAML seeds name
# hardware profiles by paths relative to it.
set -eu

if [ $# -lt 3 ]; then
	echo "usage: $0 BUILD_DIR TARGET SECONDS SEED_DIR..." >&2
	exit 2
fi
build=$1
target=$2
seconds=$3
shift 3

corpus=$build/corpus/$target
crashes=$build/crashes
log=$build/$target.log
mkdir -p "$corpus" "$crashes"

dict=$build/${target#fuzz_}.dict
set -- "$corpus" "$@"
if [ -f "$dict" ]; then
	set -- "-dict=$dict" "$@"
fi

# -timeout: one input taking 10 s is a hang (inputs are at most a few MiB).
if "$build/$target" -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
	-artifact_prefix="$crashes/$target-" "$@" >"$log" 2>&1; then
	runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
	cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1)
	echo "$target: $runs inputs in $seconds s, $cov, $(ls "$corpus" | wc -l) in $corpus; no findings"
else
	status=$?
	echo "$target: FAILED (status $status); the end of $log:" >&2
	tail -n 60 "$log" >&2
	artifact=$(sed -n "s/.*Test unit written to //p" "$log" | tail -n 1)
	if [ -n "$artifact" ]; then
		echo "$target: reproduce with: $build/$target $artifact" >&2
	fi
	exit 1
fi
