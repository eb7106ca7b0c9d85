# The two commands a fresh machine needs: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install postgresql demo test ui-test docs lint format dev sandbox bench soak clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Each warehouse has its own Dagster instance (run history, schedules, logs) beside it:
# data/warehouse.dagster for `make dev`, data/demo/warehouse.dagster for `make demo`,
# unless DAGSTER_HOME is set (pipelines/home.py).

demo: $(STAMP)
	$(BIN)/clinical-sync demo

# The tests start their own PostgreSQL servers (tests/postgres.py) from Debian's package,
# installed here when missing; CI (CI set) fails the PostgreSQL tests without it, a developer
# whose apt-get cannot install it sees them skipped with the command to run.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
postgresql:
	test -n "$(wildcard /usr/lib/postgresql/*/bin/initdb)" \
		|| ($(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) \
		|| echo "make: PostgreSQL could not be installed; its tests will skip (CI fails them)" >&2

# The suite on TEST_WORKERS processes (default: one per core, `nproc`), each test file whole on one
# of them (its module fixtures built once); TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
test: $(STAMP) postgresql
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -m "not ui" -n $(TEST_WORKERS) --dist loadfile

# The Dagster UI in a real browser: Debian's chromium driven by playwright (the `ui` extra),
# both installed here when missing; screenshots in artefacts/ui/.
CHROMIUM ?= /usr/bin/chromium
ui-test: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,ui]'
	test -x $(CHROMIUM) || $(SUDO) apt-get install -y chromium \
		|| ($(SUDO) apt-get update && $(SUDO) apt-get install -y chromium)
	CLINICAL_CHROMIUM=$(CHROMIUM) CLINICAL_UI_REQUIRED=1 $(BIN)/python -m pytest -m ui

# The manual (docs/) as a site in site/, by mkdocs (the `docs` extra, which `dev` includes):
# --strict fails on a link to a missing page or heading and on a page left out of mkdocs.yml's
# nav. NO_MKDOCS_2_WARNING: the Material theme's notice about its own future, not about ours.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

sandbox: $(STAMP)
	$(BIN)/clinical-sync sandbox

# The Dagster UI on http://127.0.0.1:$(PORT) (make dev PORT=3001), against a sandbox unless
# CLINICAL_API_BASE_URL is set; Ctrl-C or SIGTERM stops it with every process it started.
PORT ?= 3000
dev: $(STAMP)
	exec $(BIN)/clinical-sync dev --ui-port $(PORT)

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python benchmarks/run_all.py

# The simulation's 20,000 seeds (SOAK_SEEDS), then the reliability suite at 10x its CI size,
# both on TEST_WORKERS processes (the suite's files spread as `make test` spreads them).
SOAK_SEEDS ?= 0:20000
soak: $(STAMP)
	PYTHONHASHSEED=0 $(BIN)/python -m tests.simulation --seeds $(SOAK_SEEDS) --workers $(TEST_WORKERS)
	CLINICAL_SOAK=1 $(BIN)/python -m pytest -m reliability -n $(TEST_WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) data artefacts site *.egg-info
