# fleetplan — the two commands a newcomer needs are `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
OUT ?= out/quickstart

.PHONY: install run test test-unit lint services services-down bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## make run: simulate the bundled real trace slice against a simulated fleet
run: install
	$(BIN)/fleetplan simulate --trace examples/traces/azure_conv_10min.csv \
		--profile h200-llama3.1-8b --config examples/configs/quickstart.yaml --out $(OUT)

## make test: install, start real Kafka and Redis, run the whole suite
test: install services
	$(BIN)/ruff check .
	$(BIN)/pytest -q

test-unit: install
	$(BIN)/pytest -q -m "not kafka and not redis"

lint: install
	$(BIN)/ruff check .

services:
	bash scripts/services/up.sh

services-down:
	bash scripts/services/down.sh

bench: install
	$(BIN)/python bench/bench_core.py

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
