# The two set-up commands of the README: `make run` and `make test`.  Each does the whole set-up
# on a fresh machine: .venv, install (editable, with the Cython extensions built), then the job.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
PYTEST_ARGS ?=

.PHONY: run test test-slow bench bench-against build setup clean browser

# --- set-up -------------------------------------------------------------------------------------
$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip setuptools wheel "Cython>=3.0"

# Re-install when the packaging files change (the stamp keeps repeated `make test` fast).
# The spark extra (pyspark, pyarrow) is part of the test set-up: tests/spark runs a local Spark
# session, which needs a Java runtime (Debian's, when the machine has none).
$(VENV)/.installed: $(VENV)/bin/python pyproject.toml setup.py
	@command -v java >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null) || echo "no Java runtime: the Spark tests will fail"
	$(PIP) install --no-build-isolation -e '.[dev,spark]'
	touch $@

setup: $(VENV)/.installed

# Rebuild the Cython extensions in place (a no-op when nothing changed).
build: setup
	$(PY) setup.py -q build_ext --inplace -j 2 >/dev/null

# --- jobs ---------------------------------------------------------------------------------------
run: build
	$(VENV)/bin/rmq standalone $(RUN_ARGS)

# The web console's tests drive Debian's chromium through chromium-driver (Selenium).
browser:
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null) || echo "chromium unavailable: the console's browser tests will be skipped"

test: build browser
	$(PY) -m pytest tests --ignore=tests/bench -m "not slow" -q $(PYTEST_ARGS)

test-slow: build
	$(PY) -m pytest tests --ignore=tests/bench -m slow -q $(PYTEST_ARGS)

# Benchmarks need a Redis server as the baseline for the client benchmarks (Debian's package).
bench: build
	@command -v redis-server >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq redis-server >/dev/null) || echo "redis-server unavailable: Redis baselines will be skipped"
	$(PIP) install -e '.[dev,spark,bench]' --no-build-isolation
	mkdir -p .benchmarks
	$(PY) -m pytest tests/bench --benchmark-only --benchmark-columns=min,median,mean,ops,rounds --benchmark-json=.benchmarks/last.json -q $(PYTEST_ARGS)
	$(PY) -m tests.bench.report .benchmarks/last.json

# The same benchmarks in this checkout and in a worktree of REF, taking turns: before/after ratios.
bench-against: build
	@test -n "$(REF)" || (echo "usage: make bench-against REF=<commit> [PYTEST_ARGS='-k send']"; exit 2)
	@command -v redis-server >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq redis-server >/dev/null) || echo "redis-server unavailable: Redis baselines will be skipped"
	$(PIP) install -e '.[dev,spark,bench]' --no-build-isolation
	$(PY) -m tests.bench.against $(REF) --json .benchmarks/against.json -- $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info rmq_core/_native/*.c rmq_core/_native/*.so
