# Two commands do all the set-up on a fresh machine: `make demo` (the main job) and `make test`.
# Both create .venv/ and install structinit into it first.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q torch==2.14.1 torchvision==0.29.1
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/structinit demo --out runs/demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadfile  # two workers, one torch thread each (tests/conftest.py), a file each

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/lint-imports --no-cache

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/bench_init.py
