# The two entry points of README.md. Both build the same virtual environment first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test check bench mutation clean installer native

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned: this version's CPU wheel lies on this machine's disk.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The compiled data path (engine/p2p/native/*.c: DTLS records and SCTP packets, against OpenSSL's
# libcrypto). Optional: where it does not build, setup.py warns and the node runs the Python path
# (About and --self-test say so).
native: $(STAMP)
	$(BIN)/python setup.py --quiet build_ext --inplace

# With a display: the demo swarm plus the tray app as one more volunteer; without one: the swarm alone.
# Either way the coordinator (and its leaderboard) stays up until Ctrl+C.
run: $(STAMP) native
	$(BIN)/lah demo $$( [ -n "$$DISPLAY$$WAYLAND_DISPLAY" ] && echo --app )

test: $(STAMP)
	bash scripts/services
	$(MAKE) native  # after the services: they install the compiler and headers it needs
	$(BIN)/pip install --quiet -e '.[dev,nat,datasets,tensorboard]'  # the optional inputs and outputs are tested too
	# axe-core (pinned in tests/ui_pages/package.json) for the site's accessibility test.
	cd tests/ui_pages && npm ci --no-audit --no-fund --silent
	$(BIN)/python -m pytest -q

check: $(STAMP)
	scripts/check

bench: $(STAMP) native
	$(BIN)/python benchmarks/transport.py --quick --repeat 1

# The Linux bundle, .tar.gz and .deb in dist/ (installers/README.md); installers/ci-check tests them.
installer: $(STAMP) native
	$(BIN)/pip install --quiet -e '.[installer]'
	installers/build-linux

# Mutation testing of the node's guards (scripts/mutation.py, README.md); minutes, so not part of `test`.
mutation: $(STAMP)
	$(BIN)/python scripts/mutation.py

clean:
	rm -rf $(VENV) build dist
