# frametap: `make demo` and `make test` do all set-up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.frametap-installed
SOURCES := pyproject.toml setup.py $(shell find proxy -name '*.pyx' -o -name '*.pxd')

.PHONY: demo test bench install clean

install: $(STAMP)

$(STAMP): $(SOURCES)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	$(BIN)/python -m proxy.protocols --check-build
	touch $@

demo: $(STAMP)
	$(BIN)/frametap demo $(DEMO_ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -c "import matplotlib" 2>/dev/null || $(BIN)/python -m pip install -q matplotlib
	$(BIN)/python bench/run_bench.py $(BENCH_ARGS)
	$(BIN)/python bench/framelog_bench.py
	$(BIN)/python bench/protocol_benches.py

clean:
	rm -rf $(VENV) build *.egg-info
	find proxy -name '*.so' -delete -o -name '*.c' -delete
