# Thin wrapper over CMake: the two commands people expect, and the loop between.
#   make run    install what is missing, build, report on and compile a shipped model
#   make check  build (plain) and run the quick tier of the tests: every suite, the
#               tests tagged slow (tests/kiln_test.h, kt_slow) skipped; the loop to run
#               while working
#   make test   install what is missing, build twice (plain and ASan+UBSan), run every test
#               in both, then fuzz each fuzz target briefly (make fuzz); what CI runs

BUILD      ?= build
BUILD_SAN  ?= build-asan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
MODEL      ?= examples/models/deepseek-v3-671b.yaml
# Debian's interpreter, the one python3-torch is installed for (a python3
# earlier on PATH, pyenv's say, would not see it).
PYTHON     ?= /usr/bin/python3
CMAKE_ARGS ?=
BUILD_FUZZ   ?= build-fuzz
FUZZ_CC      ?= clang-14
FUZZ_SECONDS ?= 30

.PHONY: all deps build build-asan build-fuzz run check test test-plain test-asan fuzz \
	fuzz-seeds fuzz-blob fuzz-yaml test-python bench paper calibrate clean

all: build

deps:
	@sh scripts/deps.sh

build: deps
	cmake -S . -B $(BUILD) -DKILN_WERROR=ON $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	cmake -S . -B $(BUILD_SAN) -DKILN_WERROR=ON -DKILN_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD_SAN) -j $(JOBS)

# The fuzz targets are a CMake configuration of their own (fuzz/CMakeLists.txt):
# clang with libFuzzer, ASan and UBSan, and only the sources they need.
build-fuzz: deps
	cmake -S fuzz -B $(BUILD_FUZZ) -DCMAKE_C_COMPILER=$(FUZZ_CC) >/dev/null
	cmake --build $(BUILD_FUZZ) -j $(JOBS)

run: build
	./$(BUILD)/kilnc check $(MODEL)
	./$(BUILD)/kilnc report $(MODEL)
	./$(BUILD)/kilnc compile $(MODEL) --emit-svg $(BUILD)/schedule.svg --emit-trace $(BUILD)/trace.json
	@echo "schedule: $(BUILD)/schedule.svg (any SVG viewer), $(BUILD)/trace.json (ui.perfetto.dev)"

# The quick tier: KILN_TEST_TIER=quick makes every test tagged kt_slow skip
# itself (Criterion reports it skipped, not passed); the TAP copy of the run
# counts them.
check: build
	@echo "== tests, quick tier (plain build; make test runs the slow ones too)"
	@rm -f $(BUILD)/check.tap; \
		KILN_TEST_TIER=quick ./$(BUILD)/kiln_tests --jobs $(JOBS) --tap=$(BUILD)/check.tap; \
		status=$$?; \
		skipped=$$(cat $(BUILD)/check.tap 2>/dev/null | grep -c '# SKIP slow:'); \
		echo "$$skipped slow tests skipped (make test runs them)"; \
		exit $$status

test: test-plain test-python test-asan fuzz

# The Python package's tests (python/tests, docs/testing.md) against the plain
# build: pytest's summary line closes the output.
test-python: build
	@echo "== tests (Python, $(PYTHON))"
	KILN_BUILD=$(CURDIR)/$(BUILD) KILN_RT_LIBRARY=$(CURDIR)/$(BUILD)/libkiln_rt.so \
		KILN_KILNC=$(CURDIR)/$(BUILD)/kilnc PYTHONPATH=$(CURDIR)/python $(PYTHON) -m pytest -q -p no:cacheprovider python/tests

# Both tiers name the full one, whatever KILN_TEST_TIER the shell exports.
test-plain: build
	@echo "== tests (plain build)"
	KILN_TEST_TIER=full ./$(BUILD)/kiln_tests --jobs $(JOBS)

# Criterion counts a test that passes its assertions as passing even when a
# sanitizer reported in its process (a leak found at exit, say), so the run's
# output is also searched for sanitizer reports.
test-asan: build-asan
	@echo "== tests (ASan + UBSan build)"
	@( KILN_TEST_TIER=full ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
		LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		./$(BUILD_SAN)/kiln_tests --jobs $(JOBS); echo $$? > $(BUILD_SAN)/tests.status ) 2>&1 \
		| tee $(BUILD_SAN)/tests.log
	@test "$$(cat $(BUILD_SAN)/tests.status)" = 0
	@if grep -E 'ERROR: (Leak|Address)Sanitizer|runtime error:' $(BUILD_SAN)/tests.log; then \
		echo "sanitizer reports above (full log: $(BUILD_SAN)/tests.log)"; exit 1; fi

# FUZZ_SECONDS per target; docs/fuzzing.md. The blob seeds are compiled here by
# the plain build's kilnc, so they always match the current format. The two
# targets are independent single-process runs: with JOBS of 2 or more they
# run side by side, each for its FUZZ_SECONDS on a core of its own, and
# --output-sync keeps each one's report together.
fuzz: build build-fuzz
	@echo "== fuzzing ($(FUZZ_SECONDS) s per target)"
	@$(MAKE) --no-print-directory fuzz-seeds
	@$(MAKE) --no-print-directory -j $(JOBS) --output-sync=target fuzz-blob fuzz-yaml

fuzz-seeds:
	@rm -rf $(BUILD_FUZZ)/seeds && mkdir -p $(BUILD_FUZZ)/seeds/blob
	./$(BUILD)/kilnc compile examples/models/tiny.yaml -o $(BUILD_FUZZ)/seeds/blob/tiny.kiln >/dev/null
	./$(BUILD)/kilnc compile examples/models/llama3-8b-dense.yaml -o $(BUILD_FUZZ)/seeds/blob/llama3-8b-dense.kiln >/dev/null

fuzz-blob:
	sh fuzz/run.sh $(BUILD_FUZZ) fuzz_blob $(FUZZ_SECONDS) $(BUILD_FUZZ)/seeds/blob fuzz/corpus/blob

fuzz-yaml:
	sh fuzz/run.sh $(BUILD_FUZZ) fuzz_yaml $(FUZZ_SECONDS) fuzz/corpus/yaml

bench: build
	./$(BUILD)/bench_report
	./$(BUILD)/bench_schedule
	./$(BUILD)/bench_select
	./$(BUILD)/bench_compile
	sh bench/trainer.sh $(BUILD)
	KILN_RT_LIBRARY=$(CURDIR)/$(BUILD)/libkiln_rt.so PYTHONPATH=$(CURDIR)/python \
		$(PYTHON) bench/torch_bench.py $(BUILD)

# The reported table, reproduced in the simulator (docs/results.md).
PAPER_ITERS ?= 200
paper: build
	./$(BUILD)/bench_paper $(PAPER_ITERS)

# The step-time model against measured Megatron-Core runs (docs/calibration.md):
# predicted against measured step or layer time, their ratio, and FLOPs per
# token against the published figure. `./build/calibrate --fit` refits the
# profile's time_* figures.
calibrate: build
	./$(BUILD)/calibrate

clean:
	rm -rf $(BUILD) $(BUILD_SAN) $(BUILD_FUZZ)
