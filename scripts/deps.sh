#!/bin/sh
# Installs the Debian 12 packages kiln needs that are missing. As root it runs
# apt-get; as anyone else it prints the exact command to run and fails.
set -eu

# clang-14 builds the fuzz targets (make fuzz); libclang-rt-14-dev holds its
# libFuzzer and sanitizer runtimes, only a recommendation of clang-14.
# libamdhip64-5 is HIP's runtime library alone (no hipcc, no headers): the
# runtime's HIP copy backend loads it with dlopen, and tests/test_copy.c
# checks that every symbol the backend needs resolves in it.
# libopenmpi-dev and openmpi-bin (mpicc's headers and libraries, mpirun)
# build and run the CPU trainer in examples/trainer.
# python3-torch (Debian's PyTorch 1.13, CPU) and python3-pytest run the Python
# package's tests (python/tests, make test-python); no other index is needed.
# python3-pip and python3-setuptools install the package from a built tree
# (pip install --no-build-isolation ./python), which python/tests/test_install.py does.
PACKAGES="build-essential cmake pkg-config libyaml-dev libcjson-dev libglpk-dev \
libcriterion-dev libmlir-16-dev mlir-16-tools libxml2-utils libopenmpi-dev openmpi-bin \
clang-14 libclang-rt-14-dev libamdhip64-5 python3-torch python3-pytest \
python3-pip python3-setuptools"

missing=""
for p in $PACKAGES; do
	status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
	case "$status" in
	*"install ok installed"*) ;;
	*) missing="$missing $p" ;;
	esac
done

if [ -z "$missing" ]; then
	exit 0
fi

cmd="apt-get install -y --no-install-recommends$missing"
if [ "$(id -u)" -ne 0 ]; then
	echo "kiln: missing Debian packages:$missing" >&2
	echo "kiln: install them with:" >&2
	echo "  sudo apt-get update && sudo $cmd" >&2
	exit 1
fi

echo "kiln: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
$cmd
