# The two commands: `make lab` and `make test`. Everything else they need, they install.
# `make test` is the suite less the long sweeps (pytest -m "not sweep"); `make test-sweeps` runs those, and
# `make test-all` both. `make test` includes the OpInfo conformance subset (`make test-conformance` runs it alone);
# CI (.ci/run) runs `make test`; the sweeps (model zoo, whole-step and generation sweeps) are run and reported. Tests run on $(WORKERS) parallel workers (pytest-xdist); a
# notebook executed once and read by several tests keeps those tests on one worker (--dist loadgroup).
PYTHON ?= python3
WORKERS ?= 2
PYTEST = $(PY) -m pytest -q -n $(WORKERS) --dist loadgroup --durations=25
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: lab test test-sweeps test-conformance test-all install conformance bench clean labextension test-js

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): $(PY) pyproject.toml constraints-dev.txt torchtpu_lab/labextension/package.json
	$(PIP) install -q -c constraints-dev.txt torch==2.13.0
	$(PIP) install -q -c constraints-dev.txt -e ".[lab,dev,hf]"
	$(PY) -m torchtpu_lab.native  # build the native core once, before any test imports the package
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PYTEST) -m "not sweep" tests

test-sweeps: $(STAMP)
	$(PYTEST) -m sweep tests

test-conformance: $(STAMP)
	$(PYTEST) tests/test_conformance.py

test-all: test test-sweeps

lab: $(STAMP)
ifeq ($(HEADLESS),1)
	$(PY) -m torchtpu_lab.run_notebook notebooks/01_quickstart.ipynb
else
	$(VENV)/bin/jupyter lab notebooks/01_quickstart.ipynb
endif

conformance: $(STAMP)
	$(PY) bench/conformance.py --quiet

bench: $(STAMP)
	$(PY) bench/op_overhead.py

labextension:
	cd extension && npm ci --no-audit --no-fund && PATH=$(abspath $(VENV))/bin:$$PATH npm run build
	$(PIP) install -q --no-deps -e .

test-js:
	cd extension && npm ci --no-audit --no-fund && npm test

clean:
	rm -rf $(VENV) .pytest_cache
