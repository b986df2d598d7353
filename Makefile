# fleetplan — the two commands a newcomer needs are `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
TEST_STAMP := $(VENV)/.installed-test-stamp
OUT ?= out/quickstart

.PHONY: install run test test-unit lint services services-down services-status services-wipe bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The suite also runs the optional Prophet predictor's tests, so it installs that extra
# (Prophet and its Stan runtime); `make run` does not need it.
$(TEST_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[dev,prophet]'
	touch $(TEST_STAMP)

## make run: simulate the bundled real trace slice against a simulated fleet
run: install
	$(BIN)/fleetplan simulate --trace examples/traces/azure_conv_10min.csv \
		--rate-scale 20 --profile h200-llama3.1-8b --config examples/configs/quickstart.yaml \
		--out $(OUT)

## make test: install, start real Kafka and Redis, run the whole suite
test: $(TEST_STAMP) services
	$(BIN)/ruff check .
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 $(BIN)/pytest -q

test-unit: $(TEST_STAMP)
	$(BIN)/pytest -q -m "not kafka and not redis"

lint: install
	$(BIN)/ruff check .

## test services: real Kafka 4.x (KRaft) + Redis; see docs/testing.md
services:  ## install (first time) and start Kafka on 127.0.0.1:19092 and Redis on 127.0.0.1:16379
	bash scripts/services/up.sh

services-down:  ## stop both (Kafka's data and the cached jars are kept)
	bash scripts/services/down.sh

services-status:  ## exit 0 only if both services answer
	bash scripts/services/kafka.sh status && bash scripts/services/redis.sh status

services-wipe:  ## stop both and delete Kafka's data; jars stay cached
	bash scripts/services/down.sh --wipe

bench: install
	$(BIN)/python bench/bench_core.py

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
