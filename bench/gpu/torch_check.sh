#!/bin/sh
# bench/gpu/torch_check.sh [BUILD] [--dry] [--json FILE]: one Mixtral-like
# MoE layer at full size on one GPU through kiln.torch (bench/gpu/
# torch_check.py says what it prints); under 5 minutes. Needs a built tree
# (make build: kilnc and libkiln_rt.so), a Python with a CUDA build of torch
# (1.13 or later) and PyYAML (PYTHON=..., default /usr/bin/python3). --dry
# runs the same code on the CPU at tiny shapes. docs/torch.md "On a GPU".
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=build
case "${1:-}" in
	-*|'') ;;
	*) BUILD=$1; shift ;;
esac
case "$BUILD" in
	/*) ;;
	*) BUILD=$ROOT/$BUILD ;;
esac
PY=${PYTHON:-/usr/bin/python3}
[ -x "$BUILD/kilnc" ] || { echo "torch_check.sh: no $BUILD/kilnc (make build first)" >&2; exit 2; }
# cuBLAS picks deterministic kernels for a given workspace: the bitwise check.
CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}
export CUBLAS_WORKSPACE_CONFIG
KILN_RT_LIBRARY=$BUILD/libkiln_rt.so PYTHONPATH=$ROOT/python \
	exec timeout 290 "$PY" "$ROOT/bench/gpu/torch_check.py" --build "$BUILD" "$@"
