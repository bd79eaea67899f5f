# Two commands on a fresh machine: `make run` and `make test`. Each creates .venv if missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
# Every install takes its versions from here (pip -c); `make lock` remakes it.
LOCK   := constraints.txt
# The extras `make lock` resolves: every one, so each install finds its versions in the lock.
LOCK_EXTRAS := dev,devstack,bench,otlp
# make test's pytest processes (pytest-xdist); each test module runs whole in one of them, so
# its module fixtures (a server, a provider) start once
TEST_PROCESSES ?= 2

.DEFAULT_GOAL := help
.PHONY: help run test lint typecheck unit integration migrate openapi clean bench bench-faults bench-scale soak chaos lock

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml clients/python/pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c $(LOCK) -e '.[dev,devstack]' -e clients/python
	touch $(STAMP)

# make bench only: the peers' packages (pyproject.toml's bench extra)
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -c $(LOCK) -e '.[dev,devstack,bench]'
	touch $(BENCH_STAMP)

# A fresh venv of its own (never .venv, whose installed versions would win), every extra and
# the client installed from pyproject.toml's ranges alone, then pip freeze without the two
# editable projects. Fails, leaving the lock as it was, if anything cannot be installed or if
# torch was pulled in (nothing here needs it; it would mean a wrong environment was frozen).
lock: ## remake constraints.txt: the newest versions within pyproject.toml's ranges
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/python" -m pip install --quiet --upgrade pip; \
	"$$tmp/venv/bin/python" -m pip install --quiet -e '.[$(LOCK_EXTRAS)]' -e clients/python; \
	{ echo "# Made by \`make lock\` from the ranges in pyproject.toml and clients/python/pyproject.toml"; \
	  echo "# (extras $(LOCK_EXTRAS)) with Python $$("$$tmp/venv/bin/python" -c 'import platform; print(platform.python_version())'): every \`pip install\` of the Makefile"; \
	  echo "# takes its versions from here (-c). Not edited by hand: see docs/operations.md, Locked versions."; \
	  "$$tmp/venv/bin/python" -m pip freeze --exclude-editable; } > "$$tmp/lock"; \
	if grep -qi '^torch' "$$tmp/lock"; then echo "make lock: torch was pulled in; lock unchanged" >&2; exit 1; fi; \
	mv "$$tmp/lock" $(LOCK); \
	echo "$(LOCK): $$(grep -vc '^#' $(LOCK)) packages pinned"

run: $(STAMP) ## start the server on 127.0.0.1:8000 with embedded PostgreSQL and Redis (.data/)
	$(BIN)/settlement serve --embedded

migrate: $(STAMP) ## upgrade the schema (SETTLEMENT_DATABASE_URL, or the embedded one)
	$(BIN)/settlement migrate --embedded

lint: $(STAMP) ## ruff lint and format check, and the layers' import contracts (pyproject.toml)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP) ## mypy --strict on service/, devstack/, the Python client, the chaos harness, the use-case tests and bench/
	$(BIN)/mypy --strict service devstack
	$(BIN)/mypy --strict clients/python/settlement_client
	MYPYPATH=clients/python $(BIN)/mypy --strict tests/reliability tests/usecases
	MYPYPATH=clients/python $(BIN)/mypy --strict bench

test: $(STAMP) lint typecheck ## the whole suite on real PostgreSQL and Redis, with coverage
	$(BIN)/coverage erase
	@# every Python process the tests start writes a .coverage.* file of its own (pyproject.toml,
	@# [tool.coverage.run]): they are combined into .coverage even when a test failed
	$(BIN)/coverage run -m pytest -n $(TEST_PROCESSES) --dist loadfile tests clients/python/tests; status=$$?; \
	$(BIN)/coverage combine --quiet; exit $$status
	$(BIN)/coverage report --include='service/core/*' --fail-under=100
	@$(BIN)/coverage report --format=total | sed 's/^/total coverage of service\/: /; s/$$/%/'

unit: $(STAMP) ## the pure unit tests and the use-case tests on in-memory fakes (seconds)
	$(BIN)/pytest tests/unit tests/usecases -q

integration: $(STAMP) ## integration tests on real PostgreSQL and Redis
	$(BIN)/pytest tests/integration -q

clean: ## remove the virtualenv and caches (keeps .data/)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .coverage .coverage.*

bench: $(BENCH_STAMP) ## load test with two peers and baselines (wrk, pgbench); table + bench/results/<date>.json
	$(BIN)/python -m bench.run

bench-faults: $(BENCH_STAMP) ## the server and both peers under Redis FLUSHALL, SIGKILL and cut answers, then retries; money moved twice and answers lost, counted in SQL; bench/results/<date>-faults.json
	$(BIN)/python -m bench.faults

bench-scale: $(BENCH_STAMP) ## new/replay/status on BENCH_ROWS (5000000) filled operations vs empty, purge rate, sizes; bench/results/<date>-scale.json
	$(BIN)/python -m bench.scale

chaos: $(STAMP) ## the long reliability run: CHAOS_DURATION (1200) s of load under random faults, then the checker
	$(BIN)/python -m tests.reliability.chaos --duration $${CHAOS_DURATION:-1200} $${CHAOS_SEED:+--seed $$CHAOS_SEED}

soak: $(STAMP) ## memory soak: steady load for SOAK_DURATION (600) s, RSS per worker; bench/results/<date>-soak.json
	$(BIN)/python -m bench.soak

openapi: $(STAMP) ## regenerate openapi/openapi.json and openapi/openapi.yaml from the app
	$(BIN)/python -m service.http.openapi
