# gpu-alloc developer and CI entry points.  Everything runs from the venv explicitly
# (.venv/bin/...), so nothing depends on an activated shell.

SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# dockerd and runc live in /usr/sbin, which a non-login root shell may lack.
export PATH := $(PATH):/usr/sbin:/sbin

.PHONY: venv deps lint unit test demo bench bench-ab bench-stages install plugin clean distclean

venv: $(STAMP)

# Rebuilt only when pyproject.toml changes; an existing venv is reused.
$(STAMP): pyproject.toml
	[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -e '.[test]'
	touch $@

# The real-Engine tests need Debian's dockerd 20.10, docker-compose 1.29 and a static busybox;
# the deploy tests lint the shell scripts with shellcheck; the notices' tests make a
# throwaway certificate with openssl; the dashboard test runs headless
# chromium; debootstrap builds the roots of the newer Engines (26, 28:
# tests/support/engine_root.py) and the install tier's bookworm root, which
# systemd-container's systemd-nspawn boots (tests/support/systemd_root.py).
# policy-rc.d keeps apt from starting the host's own docker/containerd services: the tests run
# private engines and must not get a docker0 bridge or iptables rules as a side effect.
deps:
	@need=""; \
	command -v dockerd >/dev/null || need="$$need docker.io"; \
	command -v docker-compose >/dev/null || need="$$need docker-compose"; \
	command -v shellcheck >/dev/null || need="$$need shellcheck"; \
	command -v openssl >/dev/null || need="$$need openssl"; \
	command -v chromium >/dev/null || need="$$need chromium"; \
	command -v debootstrap >/dev/null || need="$$need debootstrap"; \
	command -v systemd-nspawn >/dev/null || need="$$need systemd-container"; \
	dpkg-query -W -f='$${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' \
		|| need="$$need busybox-static"; \
	if [ -z "$$need" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then \
		echo "make deps: missing$$need; run as root to install (engine tests skip)"; exit 0; \
	fi; \
	rc_policy=/usr/sbin/policy-rc.d; own_policy=; \
	if [ ! -e $$rc_policy ]; then \
		printf '#!/bin/sh\nexit 101\n' > $$rc_policy && chmod 755 $$rc_policy && own_policy=1; \
	fi; \
	trap '[ -z "$$own_policy" ] || rm -f '$$rc_policy EXIT; \
	apt-get update && \
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$need

# mypy reads its settings (files, strict on allocator/core) from pyproject.toml.
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The unit tier alone (tests/unit: no root, no dockerd): the quick check while working, its
# tests spread over every core (pytest-xdist).
unit: venv
	$(BIN)/python -m pytest tests/unit -q -n auto $(PYTEST_ARGS)

# The whole suite on the host's dockerd 20.10 and, in parallel, the Engine-facing suites on
# dockerd 26, 28 and 29 (Debian roots built on first use under /var/cache/gpu-alloc-tests;
# 29's dockerd comes from ../shared/engines, and without it that part says so and is skipped):
# tests/run_engines.py.  ENGINES=20.10 for the host Engine only; PYTEST_ARGS for pytest.
ENGINES ?= 20.10,26,28,29
test: deps venv lint
	$(BIN)/python -m tests.run_engines --engines "$(ENGINES)" -- $(PYTEST_ARGS)

# ENGINE=26 (or 28, 29) make demo: the same on a newer Engine, from its Debian root.
demo: deps venv
	GA_ENGINE="$${GA_ENGINE:-$(ENGINE)}" bash tests/demo.sh

# QUICK=1 make bench (or make bench QUICK=1) for a short run; ONLY=per-call,throughput (step
# names' beginnings) for some steps alone.
bench: venv
	QUICK="$(QUICK)" ONLY="$(ONLY)" $(BIN)/python -m tests.bench

# make bench-ab REV=<commit> [ROUNDS=80] [WHAT=run|burst]: GPU creates (or docker run --rm, or
# creates eight in a row) through REV and through this checkout, interleaved.
bench-ab: venv
	$(BIN)/python -m tests.bench.ab "$(REV)" $(or $(ROUNDS),80) $(WHAT)

# make bench-stages [ROUNDS=100] [CONTAINERS=0]: a GPU create's stages, stamped live in the
# shim and the plugin, beside bare --gpus 1 and floor --gpus 1 (bench-results/stages.md).
bench-stages: venv
	$(BIN)/python -m tests.bench.stages $(or $(ROUNDS),100) $(or $(CONTAINERS),0)

# The Docker managed-plugin directory (config.json + rootfs); needs a running Docker.
plugin:
	bash deploy/build-plugin.sh --out build/plugin

install:
	bash deploy/install.sh

clean:
	rm -rf build dist .pytest_cache .ruff_cache .mypy_cache .hypothesis .run *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
