# shardscale: every target sets itself up (venv + install) on a fresh machine.
# Override the torch requirement with `make setup TORCH=torch==2.14.1` (or any pip requirement).
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.shardscale-setup
# What the installed venv must match: the torch requirement and the project metadata.
SETUP_KEY = $(TORCH) $(shell cat pyproject.toml | cksum | cut -d' ' -f1)

export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1
export PYTHONUNBUFFERED := 1

.PHONY: setup test test-gpu lint bench demo parity clean

setup:
	@if [ -f $(STAMP) ] && [ "$$(cat $(STAMP))" = "$(SETUP_KEY)" ]; then \
		echo "setup: $(VENV) is up to date ($(TORCH))"; \
	else \
		set -e; \
		[ -x $(PY) ] || $(PYTHON) -m venv $(VENV); \
		$(PY) -m pip install -q --disable-pip-version-check "$(TORCH)" -e ".[dev]"; \
		echo "$(SETUP_KEY)" > $(STAMP); \
		echo "setup: installed shardscale with $(TORCH) into $(VENV)"; \
	fi

test: setup
	$(PY) -m pytest suites -q

# REQUIRE_GPUS=N (self-hosted GPU runners): strict mode, a GPU test skipped for lack of GPUs fails.
REQUIRE_GPUS ?= 0
test-gpu: setup
	$(PY) -m pytest suites -q -m gpu --require-gpus=$(REQUIRE_GPUS)

lint: setup
	$(VENV)/bin/ruff check scaler harness suites fixtures ci
	$(VENV)/bin/ruff format --check scaler harness suites fixtures ci

bench: setup
	$(PY) -m ci.bench

demo: setup
	$(PY) -m scaler.demo

clean:
	rm -rf $(VENV) reports .pytest_cache .ruff_cache
