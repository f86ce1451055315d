#!/usr/bin/env bash
# Quick start 2: set up (with test tools and redis-server), lint, then run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -q "$@"
