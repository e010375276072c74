# The two entry points of README.md. Both build the same virtual environment first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test check bench mutation clean

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned: this version's CPU wheel lies on this machine's disk.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/lah demo

test: $(STAMP)
	bash scripts/services
	$(BIN)/pip install --quiet -e '.[dev,nat]'
	$(BIN)/python -m pytest -q

check: $(STAMP)
	scripts/check

bench: $(STAMP)
	$(BIN)/python benchmarks/transport.py --quick

# Mutation testing of the node's guards (scripts/mutation.py, README.md); minutes, so not part of `test`.
mutation: $(STAMP)
	$(BIN)/python scripts/mutation.py

clean:
	rm -rf $(VENV)
