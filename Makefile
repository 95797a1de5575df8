# Thin wrapper over CMake: the two commands people expect.
#   make run    install what is missing, build, report on and compile a shipped model
#   make test   install what is missing, build twice (plain and ASan+UBSan), run every test

BUILD      ?= build
BUILD_SAN  ?= build-asan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
MODEL      ?= examples/models/deepseek-v3-671b.yaml
CMAKE_ARGS ?=

.PHONY: all deps build build-asan run test test-plain test-asan bench clean

all: build

deps:
	@sh scripts/deps.sh

build: deps
	cmake -S . -B $(BUILD) -DKILN_WERROR=ON $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	cmake -S . -B $(BUILD_SAN) -DKILN_WERROR=ON -DKILN_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD_SAN) -j $(JOBS)

run: build
	./$(BUILD)/kilnc check $(MODEL)
	./$(BUILD)/kilnc report $(MODEL)
	./$(BUILD)/kilnc compile $(MODEL) --emit-svg $(BUILD)/schedule.svg --emit-trace $(BUILD)/trace.json
	@echo "schedule: $(BUILD)/schedule.svg (any SVG viewer), $(BUILD)/trace.json (ui.perfetto.dev)"

test: test-plain test-asan

test-plain: build
	@echo "== tests (plain build)"
	./$(BUILD)/kiln_tests --jobs $(JOBS)

test-asan: build-asan
	@echo "== tests (ASan + UBSan build)"
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		./$(BUILD_SAN)/kiln_tests --jobs $(JOBS)

bench: build
	./$(BUILD)/bench_report
	./$(BUILD)/bench_schedule
	./$(BUILD)/bench_compile

clean:
	rm -rf $(BUILD) $(BUILD_SAN)
