# Two commands for a fresh clone: `make run` and `make test`. Both install into .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test lint faults bench worker clean

setup: $(STAMP)

$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	@touch $(STAMP)

# Binds to 127.0.0.1 (see .streamlit/config.toml); set HOST=0.0.0.0 to expose it deliberately.
HOST ?= 127.0.0.1
PORT ?= 8501
run: setup
	$(PY) -m streamlit run app.py --server.address $(HOST) --server.port $(PORT)

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

worker: setup
	$(PY) worker.py

RUNS ?= 1000
SEED ?= 1
faults: setup
	$(PY) -m agent.faults --runs $(RUNS) --seed $(SEED)

bench: setup
	$(PY) -m bench

clean:
	rm -rf .data .pytest_cache .ruff_cache
