#!/usr/bin/env bash
# make demo: see tests/demo.py
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m tests.demo
