# frametap: `make demo` and `make test` do all set-up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.frametap-installed
SOURCES := pyproject.toml setup.py $(shell find proxy -name '*.pyx' -o -name '*.pxd' -o -name '*_c.py')

.PHONY: demo test test-fast bench soak guard guard-update install clean

install: $(STAMP)

$(STAMP): $(SOURCES)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip "setuptools>=77"
	$(BIN)/python -m pip install -q -e '.[test]'
	$(BIN)/python -m proxy.protocols --check-build
	touch $@

demo: $(STAMP)
	$(BIN)/frametap demo $(DEMO_ARGS)

# Every test: the tier not marked slow on every core (as test-fast), then the slow tier (the
# real services, Locust runs, fuzzers, wall-clock and timing-ratio tests) one at a time, so a
# timing test never shares the machine with a second worker. The slow tier names its 25
# slowest tests: it is most of CI's time.
test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -n auto $(PYTEST_ARGS)
	$(BIN)/python -m pytest -m slow --durations=25 $(PYTEST_ARGS)

# The inner loop: everything but the tests marked slow (real Spark, RabbitMQ, Prometheus,
# Chromium, Locust runs, fuzzing rounds, wall-clock timeouts), on every core (pytest-xdist),
# naming its ten slowest tests so the tier stays fast. make test (and .ci/run) runs them all,
# one at a time.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -n auto --durations=10 $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -c "import matplotlib" 2>/dev/null || $(BIN)/python -m pip install -q matplotlib
	$(BIN)/python bench/run_bench.py $(BENCH_ARGS)
	$(BIN)/python bench/framelog_bench.py
	command -v valgrind >/dev/null && $(BIN)/python bench/callgrind_writer.py || true
	$(BIN)/python bench/protocol_benches.py

# The CI performance guard (bench/guard.py --help): the proxy's instructions (callgrind) and
# system calls (strace) per relayed FlyMQ request at 64 B, 16 KiB and 1 MiB, against
# bench/guard_reference.json; fails when a figure grows by more than its tolerance.
guard: $(STAMP)
	$(BIN)/python bench/guard.py $(GUARD_ARGS)

# Re-take the reference (medians of 3 runs) after a deliberate change, then commit it:
#   make guard-update REASON="relay: ... (why the figures moved)"
guard-update: $(STAMP)
	@test -n "$(REASON)" || { echo 'usage: make guard-update REASON="why the figures moved"' >&2; exit 2; }
	$(BIN)/python bench/guard.py --update --runs 3 --reason "$(REASON)" $(GUARD_ARGS)

# Issue 8's hostile-network figures: fuzzing both parser twins (10 M mutated frames per
# protocol), 10,000 idle connections on one route, upstreams that never answer.
soak: $(STAMP)
	$(BIN)/python bench/fuzz_twins.py $(FUZZ_ARGS)
	$(BIN)/python bench/soak.py flood $(FLOOD_ARGS)
	$(BIN)/python bench/soak.py blackhole $(BLACKHOLE_ARGS)
	$(BIN)/python bench/soak.py proxyfuzz $(PROXYFUZZ_ARGS)
	command -v valgrind >/dev/null && $(BIN)/python bench/callgrind_parsers.py || true

clean:
	rm -rf $(VENV) build *.egg-info
	find proxy -name '*.so' -delete -o -name '*.c' -delete
