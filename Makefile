# Two commands do everything on a fresh machine: `make demo` (the main job) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
BASE := $(VENV)/.installed-base
STAMP := $(VENV)/.installed

.PHONY: demo test test-all install clean

# the package alone (what the demo runs on): no torch, libtpu or notebook tools
$(BASE): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $(BASE)

# everything: the test extra (torch 2.13.0 CPU first, so nothing pulls a CUDA build; libtpu; the notebook tools)
$(STAMP): $(BASE)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(BASE)
	$(BIN)/python -m oapl_jax.main --config configs/arithmetic.py --workdir runs/demo

test: $(STAMP)
	$(BIN)/python -m pytest tests -m "not slow" -n auto --maxprocesses 4 --dist loadfile --durations=15

test-all: $(STAMP)
	$(BIN)/python -m pytest tests

clean:
	rm -rf $(VENV) runs
