# gpu-health: `make up` runs the pipeline locally, `make test` passes the tests.
# Everything that needs installing (JDK-run Kafka jars, TimescaleDB build,
# Python venv) is installed on first use and cached in $(GPUHEALTH_CACHE).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

export GPUHEALTH_CACHE ?= $(HOME)/.cache/gpu-health
VENV ?= $(GPUHEALTH_CACHE)/venv
PY := $(VENV)/bin/python
export PYTHONPATH := $(CURDIR)
export GPUHEALTH_VENV := $(VENV)
PYTEST_ARGS ?=
TOPIC ?= gpu-metrics-raw
ARGS ?=

.PHONY: help venv venv-dev services services-down services-status migrate topics schemas up down \
        test test-unit test-integration tools lint format openapi docs bench evaluate train-predictor calibrate-predictor \
        kafka-console-consumer kafka-topics kafka-consumer-groups psql compose-test

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-24s %s\n", $$1, $$2}'
	@echo
	@echo "CLI (after make venv or make up): $(VENV)/bin/gpuhealth fleet | gpu UUID | alerts | ack ID --key KEY"
	@echo "  (--url or GPUHEALTH_URL picks the API; default http://127.0.0.1:8000; gpuhealth --help for more)"
	@echo "Installing (the venv needs neither): pip install ./gpuhealth (the training library alone), or"
	@echo "  pip install ./gpuhealth . (the pipeline too: gpuhealth-api, gpuhealth-collector, ... each --help)"

venv: ## create/update the Python virtual environment with what running needs (cached, keyed by pyproject.toml)
	@scripts/pyenv.sh >/dev/null

venv-dev: ## the same venv, plus the development tools (pytest, hypothesis, ruff, mypy, ...)
	@scripts/pyenv.sh --dev >/dev/null

services: ## start Kafka (KRaft), PostgreSQL+TimescaleDB, kube-apiserver+etcd and Slurm natively, wait until healthy
	@scripts/services.sh start

services-down: ## stop Kafka, PostgreSQL, kube-apiserver and Slurm
	@scripts/services.sh stop

services-status: ## show whether Kafka, PostgreSQL, kube-apiserver and Slurm are up
	@scripts/services.sh status

migrate: venv ## apply schema/*.sql migrations (each once)
	@source scripts/env.sh && $(PY) -m shared.plumbing.migrate

topics: venv ## create the project's Kafka topics (idempotent)
	@source scripts/env.sh && $(PY) -m shared.plumbing.topic_admin

schemas: venv ## write every topic's JSON Schema under schema/json/ from shared/contract/topic_registry.py (commit them)
	@$(PY) -m shared.contract.topic_registry

up: venv ## run the pipeline: Kafka, TimescaleDB, mock fleet, collector, sink, scorer, remediator (dry run), API (SCORERS=N: N scorers; REMEDIATOR=live: the remediator acts, on a kube-apiserver and Slurm it starts too)
	@scripts/services.sh start core
	@$(MAKE) --no-print-directory migrate topics
	@$(if $(SCORERS),GPUHEALTH_SCORERS=$(SCORERS) )$(if $(REMEDIATOR),GPUHEALTH_REMEDIATOR_MODE=$(REMEDIATOR) )scripts/stack.sh up

down: ## stop everything `make up` started
	@scripts/stack.sh down
	@scripts/services.sh stop

test: services venv-dev tools ## start the services (the schedulers too), install the test tools, then run the whole test suite
	@$(PY) -m pytest $(PYTEST_ARGS)

compose-test: venv-dev ## docker compose for real: install Docker, build local images, up, check from the host, down
	@scripts/compose-test.sh

tools: ## install the tools the tests use (promtool, docker CLI, chromium, wrk, systemd-analyze; scripts/install-tools.sh)
	@scripts/install-tools.sh

test-unit: venv-dev tools ## unit tests only (no services needed)
	@$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: services venv-dev tools ## integration tests only (real Kafka, TimescaleDB, kube-apiserver, Slurm)
	@$(PY) -m pytest tests/integration $(PYTEST_ARGS)

lint: venv-dev ## ruff (lint + format check) and mypy
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check .
	@$(VENV)/bin/mypy

openapi: venv ## write the API's OpenAPI document to docs/api/openapi.json (a unit test fails when it is stale)
	@$(PY) -m services.api.openapi

format: venv-dev ## apply ruff's formatting and safe fixes
	@$(VENV)/bin/ruff format .
	@$(VENV)/bin/ruff check --fix .

docs: venv ## write the generated docs: the configuration reference (from the settings) and the OpenAPI document
	@$(PY) -m shared.settings.reference
	@$(PY) -m services.api.openapi

SCENARIO ?=
evaluate: services venv-dev ## score simulated fleets against their ground truth (SCENARIO=file.json, else the default suite), the remediator's decisions against outcomes, then a year of lifecycle decisions
	@GPUHEALTH_LOG__LEVEL=WARNING $(PY) -m evaluation $(if $(SCENARIO),--scenario $(SCENARIO)) $(ARGS)
	@$(if $(SCENARIO),true,out=$$(mktemp -d) && trap 'rm -rf "$$out"' EXIT && \
	  GPUHEALTH_LOG__LEVEL=WARNING $(PY) -m evaluation.outcomes --remedy-outcomes "$$out/remedies.json" && \
	  $(PY) -m evaluation.lifecycle --remedy-outcomes "$$out/remedies.json")

train-predictor: services venv-dev ## fit the failure predictor on simulated fleets (training seeds only) -> config/predictor-weights.toml, then calibrate it
	@GPUHEALTH_LOG__LEVEL=WARNING $(PY) -m evaluation.train $(ARGS)
	@$(MAKE) --no-print-directory calibrate-predictor

calibrate-predictor: venv ## map the predictor's score to observed p(fail in 30 d) on fleets run to failure (training seeds only) -> config/predictor-calibration.toml
	@$(PY) -m evaluation.calibrate

bench: services venv-dev tools ## run every benchmark in bench/ (prints figures next to their baselines)
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) "$$b"; done

kafka-console-consumer: ## read a topic: make kafka-console-consumer TOPIC=gpu-events ARGS=--from-beginning
	@bin/kafka-console-consumer --topic $(TOPIC) --formatter-property print.key=true $(ARGS)

kafka-topics: ## list the broker's topics (ARGS to override, e.g. ARGS="--describe --topic gpu-events")
	@bin/kafka-topics $(if $(ARGS),$(ARGS),--list)

kafka-consumer-groups: ## list consumer groups with their lag
	@bin/kafka-consumer-groups $(if $(ARGS),$(ARGS),--describe --all-groups)

psql: ## open psql on the local gpu_health database
	@source scripts/env.sh && PGPASSWORD=$$GPUHEALTH_DB_PASSWORD psql -h 127.0.0.1 -p $$GPUHEALTH_PG_PORT -U $$GPUHEALTH_DB_USER $$GPUHEALTH_DB_NAME $(ARGS)
