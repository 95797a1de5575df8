#!/bin/sh
# scripts/same_plans.sh OLD_KILNC NEW_KILNC [kilnc compile options...]
#
# Compiles every shipped model (examples/models/*.yaml) with two kilnc
# binaries and compares what each writes: the blob byte for byte and the
# --json document (plan tables, budgets, baselines), plus the exit status.
# For refactorings that must not change a plan (docs/passes.md). Prints one
# line per model; exit status 0 when every model is identical, 1 otherwise,
# 2 on a usage error. Work files go to a temporary folder, removed at exit.
set -u
if [ $# -lt 2 ]; then
	echo "usage: $0 OLD_KILNC NEW_KILNC [compile options...]" >&2
	exit 2
fi
old=$1 new=$2
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
status=0 n=0
for m in "$root"/examples/models/*.yaml; do
	name=$(basename "$m" .yaml)
	for side in old new; do
		eval k=\$$side
		"$k" compile "$m" -o "$tmp/$name.$side.kiln" --json "$@" >"$tmp/$name.$side.json" 2>/dev/null
		echo $? >"$tmp/$name.$side.rc"
	done
	what=""
	cmp -s "$tmp/$name.old.rc" "$tmp/$name.new.rc" || what="$what exit-status"
	if [ -e "$tmp/$name.old.kiln" ] || [ -e "$tmp/$name.new.kiln" ]; then
		cmp -s "$tmp/$name.old.kiln" "$tmp/$name.new.kiln" || what="$what blob"
	fi
	cmp -s "$tmp/$name.old.json" "$tmp/$name.new.json" || what="$what json"
	n=$((n + 1))
	if [ -z "$what" ]; then
		echo "same      $name (exit $(cat "$tmp/$name.new.rc"), blob $(wc -c <"$tmp/$name.new.kiln" 2>/dev/null || echo 0) bytes)"
	else
		echo "DIFFERENT $name:$what"
		status=1
	fi
done
[ $n -gt 0 ] || { echo "$0: no models under $root/examples/models" >&2; exit 2; }
exit $status
