# Two commands do all the set-up: `make demo` (the live demo) and `make test` (the whole suite).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-unit lint setup kafka-jars clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
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

clean:
	-$(BIN)/rollout infra down
	rm -rf .data
