PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint demo bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

## make test: install into .venv and run the whole test suite against real redis-servers
test: $(STAMP)
	$(BIN)/pytest

## make lint: ruff and mypy, as CI runs them
lint: $(STAMP)
	$(BIN)/ruff check stampede integrations tests bench
	$(BIN)/ruff format --check stampede integrations tests bench
	$(BIN)/mypy

## make demo: the side-by-side benchmark on an embedded redis-server
demo: $(STAMP)
	$(BIN)/python -m bench

bench: demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
