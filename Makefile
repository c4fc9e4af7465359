# redis-quota — see README.md. Every target works on a fresh Debian machine: `make test` installs
# what is missing (as root via apt-get; otherwise it prints the command to run).

CARGO   ?= cargo
PORT    ?= 6379
CLUSTER_PORT ?= 30001
REDIS_SERVER ?= redis-server
MODULE_DEBUG   := target/debug/libredis_quota.so
MODULE_RELEASE := target/release/libredis_quota.so
# The integration suite runs once on each; the first also runs the unit and property tests.
TEST_SERVERS   ?= redis-server valkey-server
# Test files that start servers (the others are pure unit/property tests: run once).
SERVER_TESTS   := $(sort $(basename $(notdir $(shell grep -lE '^mod (common|reliability);' tests/*.rs))))

.PHONY: deps build release run test unit integration demo lint fmt bench fuzz soak cluster clean venv pytest pylint gateway

## deps: install what is missing (scripts/deps.sh: redis-server, valkey-server from
## bookworm-backports on Debian 12, libclang-dev for bindgen, postgresql, python3-venv).
deps:
	@scripts/deps.sh
	@redis-server --version
	@valkey-server --version

## build: the debug module (target/debug/libredis_quota.so).
build: deps
	$(CARGO) build

release: deps
	$(CARGO) build --release

## run: Redis (or REDIS_SERVER=valkey-server) in the foreground with the release module and
## redis.conf.example (PORT=6379), in a fresh temp dir each time (its AOF is not reused: every
## run starts empty).
run: release
	@set -e; dir=$$(mktemp -d -t redis-quota-run.XXXXXX); trap 'rm -rf "$$dir"' EXIT; \
	sed 's#^loadmodule \./#loadmodule $(CURDIR)/#' redis.conf.example > $$dir/redis.conf; \
	echo "make run: a fresh server; its data (AOF) goes to $$dir, removed when it stops"; \
	$(REDIS_SERVER) $$dir/redis.conf --port $(PORT) --dir $$dir & pid=$$!; \
	trap 'kill -TERM $$pid 2>/dev/null || true' INT TERM HUP; \
	while kill -0 $$pid 2>/dev/null; do wait $$pid || true; done

## test: everything — unit and property tests, then the integration suite (each test starts its
## own servers, tests/cluster.rs a 3+3 cluster) and the Python tests (make pytest) once per
## server in TEST_SERVERS; quota-export's tests (exporter/: a SQLite file and a throwaway
## PostgreSQL server) once, against the first server.
test: build
	QUOTA_MODULE=$(CURDIR)/$(MODULE_DEBUG) $(CARGO) test -p quota-export -- --test-threads=2
	@set -e; first=1; for server in $(TEST_SERVERS); do \
	  echo "== make test: $$server ($$($$server --version | cut -d' ' -f1-3))"; \
	  if [ $$first = 1 ]; then \
	    QUOTA_MODULE=$(CURDIR)/$(MODULE_DEBUG) QUOTA_EXPORT=$(CURDIR)/target/debug/quota-export \
	      REDIS_SERVER=$$server $(CARGO) test -- --test-threads=2; \
	  else \
	    QUOTA_MODULE=$(CURDIR)/$(MODULE_DEBUG) REDIS_SERVER=$$server \
	      $(CARGO) test $(addprefix --test ,$(SERVER_TESTS)) -- --test-threads=2; \
	  fi; \
	  REDIS_SERVER=$$server $(MAKE) --no-print-directory pytest; \
	  first=0; \
	done

## cluster: a 3-master + 3-replica cluster on loopback with the release module, for trying it
## out (scripts/cluster.sh; PORT=first port, default 30001; REDIS_SERVER=valkey-server for
## Valkey). Prints how to connect; Ctrl-C stops it and removes its data.
cluster: release
	@REDIS_SERVER=$(REDIS_SERVER) PORT=$(CLUSTER_PORT) scripts/cluster.sh $(CURDIR)/$(MODULE_RELEASE)

## demo: replay the Azure LLM inference trace through the module in the trace's own time, sped
## up SPEED times (default 60: about a minute); writes the SVG report to REPORT (see
## examples/README.md; REPORT=docs/img/demo-report.svg refreshes the README's picture).
## quota-export moves the token budgets' usage streams into target/demo-usage.sqlite during
## the replay, and `quota-export reconcile` must pass at the end (docs/usage-export.md).
SPEED  ?= 60
REPORT ?= $(CURDIR)/target/demo-report.svg
demo: release
	$(CARGO) build --release -p quota-export
	QUOTA_MODULE=$(CURDIR)/$(MODULE_RELEASE) QUOTA_EXPORT=$(CURDIR)/target/release/quota-export \
	  SPEED=$(SPEED) REPORT=$(REPORT) \
	  $(CARGO) run --release --example replay

## bench: the module against the Lua scripts it replaces (speed, memory, sweeper); writes
## docs/benchmarks.md. QUICK=1 for a short run (under a minute, plus the first build; printed only, BENCH_OUT=path to write it).
bench: release
	$(CARGO) build --release --example apifloor
	QUOTA_MODULE=$(CURDIR)/$(MODULE_RELEASE) BENCH_QUICK=$(QUICK) $(CARGO) run --release --example bench

## fuzz: the decoder properties (tests/fuzz_decoders.rs: RDB/RESTORE decoders, QUOTA.APPLY
## tokens) with PROPTEST_CASES=$(FUZZ_CASES), for FUZZ_SECONDS (default 60) shared among them,
## then the live fuzz (tests/fuzz_live.rs) for FUZZ_SECONDS more, with FUZZ_SEED (default: from
## the clock; printed, to replay a failure). A failure found in time is always shrunk and
## reported; `timeout` only stops a run that hangs. (cargo-fuzz would need a nightly toolchain.)
FUZZ_SECONDS ?= 60
FUZZ_CASES   ?= 200000
fuzz: build
	$(CARGO) test --test fuzz_decoders --test fuzz_live --no-run
	PROPTEST_CASES=$(FUZZ_CASES) FUZZ_SECONDS=$(FUZZ_SECONDS) timeout $$(( $(FUZZ_SECONDS) + 300 )) \
	  $(CARGO) test --test fuzz_decoders -- --test-threads=1 --nocapture
	QUOTA_MODULE=$(CURDIR)/$(MODULE_DEBUG) FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_LINES=1000000000 \
	  FUZZ_SEED=$${FUZZ_SEED:-$$(date +%s)} timeout $$(( $(FUZZ_SECONDS) + 300 )) \
	  $(CARGO) test --test fuzz_live -- --nocapture

## soak: master + replica + AOF under a mixed workload for SOAK_MINUTES (default 10), with
## BGREWRITEAOF/BGSAVE, digest comparisons and invariant checks (examples/soak.rs). Not in CI.
SOAK_MINUTES ?= 10
soak: release
	QUOTA_MODULE=$(CURDIR)/$(MODULE_RELEASE) SOAK_MINUTES=$(SOAK_MINUTES) \
	  $(CARGO) run --release --example soak

## lint: formatting and clippy, warnings are errors.
lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(MAKE) --no-print-directory pylint

fmt:
	$(CARGO) fmt --all

## venv: .venv (python3 -m venv) with the Python client (clients/python) and the gateway example
## (examples/gateway) installed editable, with their test tools (pytest, httpx, mypy, ruff).
PYTHON ?= python3
VENV   := .venv
PY_PROJECTS := clients/python examples/gateway
$(VENV)/.installed: clients/python/pyproject.toml examples/gateway/pyproject.toml
	@$(PYTHON) -c 'import ensurepip' 2>/dev/null || { echo "venv: $(PYTHON) cannot make a venv — run: apt-get install -y python3-venv"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e 'clients/python[test]' -e 'examples/gateway[test]'
	touch $@
venv: $(VENV)/.installed

## pytest: the Python client's and the gateway's tests (each starts its own redis-server with the
## debug module, the gateway's also uvicorn, on free ports).
pytest: build venv
	QUOTA_MODULE=$(CURDIR)/$(MODULE_DEBUG) $(VENV)/bin/pytest -q -p no:cacheprovider --rootdir=$(CURDIR) clients/python/tests examples/gateway/tests

## pylint: ruff (lint + format check) and mypy --strict over the Python client and the gateway.
pylint: venv
	$(VENV)/bin/ruff check $(PY_PROJECTS)
	$(VENV)/bin/ruff format --check $(PY_PROJECTS)
	cd clients/python && $(CURDIR)/$(VENV)/bin/mypy src tests
	cd examples/gateway && MYPYPATH=tests $(CURDIR)/$(VENV)/bin/mypy quota_gateway tests

## gateway: the example gateway (docs/gateway.md) on GATEWAY_PORT (8000) in the foreground, over a
## fresh redis-server with the release module on GATEWAY_REDIS_PORT (6390), provisioned from
## examples/gateway/tenants.example.json (GATEWAY_CONFIG=...). REDIS_URL=... uses a running
## server instead.
GATEWAY_PORT       ?= 8000
GATEWAY_REDIS_PORT ?= 6390
gateway: release venv
	@set -e; if [ -n "$$REDIS_URL" ]; then \
	  exec $(VENV)/bin/python -m quota_gateway --provision --port $(GATEWAY_PORT); fi; \
	dir=$$(mktemp -d -t redis-quota-gateway.XXXXXX); \
	redis-server --port $(GATEWAY_REDIS_PORT) --bind 127.0.0.1 --dir $$dir --save '' --appendonly no \
	  --loadmodule $(CURDIR)/$(MODULE_RELEASE) > $$dir/redis.log 2>&1 & rpid=$$!; \
	trap 'kill $$rpid 2>/dev/null || true; rm -rf "$$dir"' EXIT INT TERM HUP; \
	until redis-cli -p $(GATEWAY_REDIS_PORT) ping >/dev/null 2>&1; do \
	  kill -0 $$rpid 2>/dev/null || { cat $$dir/redis.log; exit 1; }; sleep 0.1; done; \
	echo "make gateway: redis-server on port $(GATEWAY_REDIS_PORT) (data in $$dir, removed on exit)"; \
	REDIS_URL=redis://127.0.0.1:$(GATEWAY_REDIS_PORT)/0 $(VENV)/bin/python -m quota_gateway \
	  --provision --port $(GATEWAY_PORT)

clean:
	$(CARGO) clean
