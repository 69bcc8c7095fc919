# The two commands: `make lab` and `make test`. Everything else they need, they install.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: lab test install conformance bench clean labextension test-js

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
	$(PY) -m pytest -q tests

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
