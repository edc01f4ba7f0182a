# Two commands do all the set-up: `make demo` (the live demo) and `make test` (the whole suite).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

LOCK_VENV := .data/lock-venv

.PHONY: demo test test-unit lint setup kafka-jars lock clean

# The versions of constraints.txt (the set the suite last passed on), within pyproject.toml's ranges.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip -c constraints.txt
	$(BIN)/pip install -q -e '.[dev]' -c constraints.txt
	@touch $(STAMP)

setup: $(STAMP) kafka-jars

kafka-jars: $(STAMP)
	$(BIN)/rollout infra fetch

demo: setup
	$(BIN)/rollout demo

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# Refresh constraints.txt: the newest versions pyproject.toml allows, installed in a scratch environment
# and frozen (the project itself and the build tools left out). Run `make test lint` before committing it.
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q --upgrade pip
	$(LOCK_VENV)/bin/pip install -q -e '.[dev]'
	{ sed -n '/^#/p' constraints.txt; $(LOCK_VENV)/bin/pip freeze --all --exclude-editable \
	    | grep -v -E '^(setuptools|wheel)=='; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf $(LOCK_VENV)
	@echo "constraints.txt refreshed; review it with git diff, then run make test lint"

clean:
	-$(BIN)/rollout infra down
	rm -rf .data
