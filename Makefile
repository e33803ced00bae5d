PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Django 6 needs Python 3.12+: the first such interpreter found, if any.
PYTHON_DJANGO6 ?= $(shell for p in python3.13 python3.12 $(PYTHON) $(wildcard $(HOME)/.pyenv/versions/3.1[2-9]*/bin/python3); do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null \
	&& { echo $$p; break; }; done)
VENV6 := .venv-django6

.PHONY: test test-soak test-near-cache test-django6 lint demo bench docs clean

# pytest-xdist workers for make test's stages: each starts its own servers and
# claims its ports (stampede.testing), so they share nothing but the cores.
TEST_WORKERS ?= 2

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e . --group dev "django>=5.2,<6"
	touch $(STAMP)

## make test: install into .venv and run the suite against real redis-servers
## (Django 5.2 LTS, redis-py's own parser) on TEST_WORKERS processes, the behaviour
## tests again with a near cache in every instance, then, where Python 3.12+
## exists, the Django tests on Django 6 and the near-cache and ACL tests, all
## with the hiredis parser (the multi-process and fault-injection ones, marked
## slow, run on Django 5.2 only). The long loads and soaks are make test-soak's.
test: $(STAMP)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup -m "not soak"
	$(MAKE) test-near-cache
	$(MAKE) test-django6

## make test-soak: the long loads and soaks (marked soak), one at a time, as
## nothing else runs: sustained load through every app server, random faults
test-soak: $(STAMP)
	$(BIN)/pytest -m soak

test-near-cache: $(STAMP)
	$(BIN)/pytest -n $(TEST_WORKERS) --near-cache tests/test_behaviour.py tests/test_sync.py tests/test_asyncio.py \
		tests/test_cached.py tests/test_signing.py tests/test_serializers.py tests/test_inputs.py

$(VENV6)/.installed: pyproject.toml
	$(PYTHON_DJANGO6) -m venv $(VENV6)
	$(VENV6)/bin/pip install --quiet --upgrade pip
	$(VENV6)/bin/pip install --quiet -e ".[hiredis]" --group test "django>=6,<7"
	touch $@

test-django6:
ifeq ($(PYTHON_DJANGO6),)
	@echo "test-django6: no Python 3.12+ found; Django 6 not tested here"
else
	$(MAKE) $(VENV6)/.installed
	STAMPEDE_TEST_PARSER=hiredis $(VENV6)/bin/pytest -n $(TEST_WORKERS) -m "not soak and not slow" \
		tests/django_stampede tests/test_near_cache.py tests/test_acl.py
endif

## make lint: ruff, mypy, and the generated blocking twins of asyncio sources, as CI runs them
lint: $(STAMP)
	$(BIN)/ruff check stampede integrations tests bench example_project support tools
	$(BIN)/ruff format --check stampede integrations tests bench example_project support tools
	$(BIN)/mypy
	$(BIN)/python tools/unasync.py --check

## make demo: the example Django site and Flask app under a stampede, on
## their stock Redis caches and then on stampede (an embedded redis-server
## unless REDIS_URL is set); prints a table per app, writes stampede-demo.png
demo: $(STAMP)
	$(BIN)/python -m example_project.demo $(DEMO_ARGS)

## make bench: stampede side by side with its peers, each on its own redis-server
## (python -m bench herd); BENCH_ARGS="NAME [options]" runs another benchmark
## (python -m bench lists them; bench/README.md says what each one backs)
BENCH_ARGS ?= herd
bench: $(STAMP)
	$(BIN)/pip install --quiet -e . --group bench
	$(BIN)/python -m bench $(BENCH_ARGS)

DOCS_STAMP := $(VENV)/.docs-installed

# Only the docs group (the reference is read from the sources, not imported):
# a fresh clone's make docs needs neither the test nor the demo groups.
$(DOCS_STAMP): pyproject.toml
	test -x $(BIN)/python || { $(PYTHON) -m venv $(VENV) && $(BIN)/pip install --quiet --upgrade pip; }
	$(BIN)/pip install --quiet -e . --group docs
	touch $@

## make docs: the documentation site (mkdocs.yml) into .cache/site, built
## --strict: a broken link or anchor, a page left out of the nav, an
## unresolved cross-reference or a docstring the API reference warns about
## fails it. Nothing is fetched while building.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) $(VENV6) .pytest_cache .mypy_cache .ruff_cache .cache stampede-demo.png
