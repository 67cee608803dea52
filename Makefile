# The two set-up commands of the README: `make run` and `make test`.  Each does the whole set-up
# on a fresh machine: .venv, install (editable, with the Cython extensions built), then the job.
# `make run` installs only what a broker needs; `make test` adds the test extras, PySpark, a Java
# runtime, chromium and etcd.  Each has its own stamp, so either may come first and neither undoes the other.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# -qq: pip's errors only, not the build backend's notices (which look like failures)
PIP    := $(PY) -m pip --disable-pip-version-check -qq
PYTEST_ARGS ?=
# The requirements of optional-dependency groups of pyproject.toml, one a line (the one list of them).
EXTRAS = $(PY) -c 'import sys, tomllib; d = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]; print("\n".join(r for e in sys.argv[1:] for r in d[e]))'

.PHONY: run test test-slow bench bench-against build build-run setup setup-run clean browser etcd rmq5-client dist

# --- set-up -------------------------------------------------------------------------------------
$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip setuptools wheel "Cython>=3.0" build

# rmq itself and its run-time dependencies: all `make run` needs.  The Cython extensions are built
# in place first (two at a time), so pip's editable install skips them (setup.py: RMQ_SKIP_EXT_BUILD).
# Re-installed when the packaging files change.
$(VENV)/.installed-run: $(VENV)/bin/python pyproject.toml setup.py
	@test -f /usr/include/openssl/sha.h || (apt-get update -qq && apt-get install -y -qq libssl-dev >/dev/null) || echo "no OpenSSL headers (libssl-dev): rmq_core/_native/hmac_sha1 will not build"
	$(PY) setup.py -q build_ext --inplace -j 2 >/dev/null
	RMQ_SKIP_EXT_BUILD=1 RMQ_SKIP_JAR_BUILD=1 $(PIP) install --no-build-isolation -e .
	touch $@

# The test set-up adds the extras without re-building rmq: the dev tools and the spark extras
# (pyspark, pyarrow, and Spark Connect's client libraries; tests/spark runs local Spark sessions,
# which need a Java runtime - Debian's, when the machine has none).
$(VENV)/.installed-test: $(VENV)/.installed-run
	@command -v java >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null) || echo "no Java runtime: the Spark tests will fail"
	@command -v javac >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless >/dev/null) || echo "no JDK (javac): spark_plugin's JVM reader will not be built"
	$(EXTRAS) dev spark spark-connect > $(VENV)/extras.txt
	$(PIP) install -r $(VENV)/extras.txt
	$(PY) -m spark_plugin.jvm.build
	touch $@

setup-run: $(VENV)/.installed-run
setup: $(VENV)/.installed-test

# Rebuild the Cython extensions in place (a no-op when nothing changed).
build-run: setup-run
	$(PY) setup.py -q build_ext --inplace -j 2 >/dev/null
# ... and spark_plugin's JVM reader (rmq-spark.jar, a no-op when up to date).
build: setup build-run
	$(PY) -m spark_plugin.jvm.build

# Apache's RocketMQ 5 Python client, which tests/rmq5 drive over gRPC, in a virtual environment of
# its own: its top-level package `rocketmq` is also the 4.x C++ client's (rocketmq==0.4.4, in .venv).
# The stamp names the pinned version, so a new pin installs again.
RMQ5_VENV := .venv-rmq5
RMQ5_CLIENT_VERSION := 5.1.2
$(RMQ5_VENV)/.installed-$(RMQ5_CLIENT_VERSION):
	$(PYTHON) -m venv $(RMQ5_VENV)
	$(RMQ5_VENV)/bin/python -m pip --disable-pip-version-check -qq install "rocketmq-python-client==$(RMQ5_CLIENT_VERSION)"
	touch $@
rmq5-client: $(RMQ5_VENV)/.installed-$(RMQ5_CLIENT_VERSION)

# --- jobs ---------------------------------------------------------------------------------------
# The sdist and a wheel for this machine's Python and platform, in dist/ (`python -m build`; the
# wheel is built from the sdist, with the build requirements .venv holds: nothing is downloaded).
dist: $(VENV)/bin/python
	@$(PY) -c 'import build' 2>/dev/null || $(PIP) install build
	$(PY) -m build --no-isolation --outdir dist .

run: build-run
	$(VENV)/bin/rmq standalone $(RUN_ARGS)

# The web console's tests drive Debian's chromium through chromium-driver (Selenium).
browser:
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null) || echo "chromium unavailable: the console's browser tests will be skipped"

# The controller tests run real etcd members (Debian's etcd-server: etcd 3.4, v3 API) on free ports.
# policy-rc.d answers 101 for the install so the package's own etcd service is never started
# (it would hold 2379/2380); a policy-rc.d the machine already had is put back afterwards.
etcd:
	@command -v etcd >/dev/null 2>&1 || { \
	  saved=; if [ -e /usr/sbin/policy-rc.d ]; then saved=$$(mktemp) && cp -p /usr/sbin/policy-rc.d "$$saved"; fi; \
	  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d; \
	  (apt-get update -qq && apt-get install -y -qq etcd-server >/dev/null); rc=$$?; \
	  if [ -n "$$saved" ]; then mv -f "$$saved" /usr/sbin/policy-rc.d; else rm -f /usr/sbin/policy-rc.d; fi; \
	  [ $$rc -eq 0 ] || echo "etcd-server unavailable: the controller tests will fail"; }

# Two workers, each taking whole test files (a module's servers are started once): the suite
# waits on servers and processes more than it computes.
test: build browser etcd rmq5-client
	$(PY) -m pytest tests --ignore=tests/bench -m "not slow" -q -n 2 --dist loadfile --durations=25 $(PYTEST_ARGS)

test-slow: build etcd rmq5-client
	$(PY) -m pytest tests --ignore=tests/bench -m slow -q $(PYTEST_ARGS)

# Benchmarks need a Redis server as the baseline for the client benchmarks (Debian's package), and
# etcd for the failover benchmarks.
bench: build etcd rmq5-client
	@command -v redis-server >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq redis-server >/dev/null) || echo "redis-server unavailable: Redis baselines will be skipped"
	$(EXTRAS) bench > $(VENV)/extras-bench.txt && $(PIP) install -r $(VENV)/extras-bench.txt
	mkdir -p .benchmarks
	$(PY) -m pytest tests/bench --benchmark-only --benchmark-columns=min,median,mean,ops,rounds --benchmark-json=.benchmarks/last.json -q $(PYTEST_ARGS)
	$(PY) -m tests.bench.report .benchmarks/last.json

# The same benchmarks in this checkout and in a worktree of REF, taking turns: before/after ratios.
bench-against: build etcd
	@test -n "$(REF)" || (echo "usage: make bench-against REF=<commit> [PYTEST_ARGS='-k send']"; exit 2)
	@command -v redis-server >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq redis-server >/dev/null) || echo "redis-server unavailable: Redis baselines will be skipped"
	$(EXTRAS) bench > $(VENV)/extras-bench.txt && $(PIP) install -r $(VENV)/extras-bench.txt
	$(PY) -m tests.bench.against $(REF) --json .benchmarks/against.json -- $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(RMQ5_VENV) build dist *.egg-info rmq_core/_native/*.c rmq_core/_native/*.so spark_plugin/jvm/*.jar
