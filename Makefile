# The two commands of the README:
#   make run    set up .venv and train the default job (ARGS="model=gat +cluster=local" to change it)
#   make test   set up .venv and run the test suite
# TORCH_SPEC picks the torch build installed before the project (default: the tested release, which
# PyPI serves as its CUDA build on Linux; CPU-only nodes:
#   TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
# a given CUDA: TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126").
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
ARGS ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hpcgnn-installed

.PHONY: run test lint setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py $(wildcard hpcgnn/kernels/*.c hpcgnn/kernels/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH_SPEC)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[dev]"
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m hpcgnn $(ARGS)

# The tests run on TEST_WORKERS pytest-xdist workers (the SLURM dev cluster's tests one after another on one of
# them), then those marked alone (they look at the whole machine's /dev/shm) with nothing beside them; both run,
# and the first failure's status is make's (a phase with no test selected is no failure).
TEST_WORKERS ?= 2
test: $(STAMP)
	@status=0; \
	$(PY) -m pytest -q -ra --durations=40 -n $(TEST_WORKERS) --dist loadgroup --phase=shared tests $(ARGS) || { s=$$?; [ $$s = 5 ] || status=$$s; }; \
	$(PY) -m pytest -q -ra --durations=4 --phase=alone tests $(ARGS) || { s=$$?; [ $$s = 5 ] || [ $$status != 0 ] || status=$$s; }; \
	exit $$status

lint: $(STAMP)
	$(PY) -m ruff check hpcgnn hydra_plugins tests benchmarks

clean:
	rm -rf outputs multirun .pytest_cache
