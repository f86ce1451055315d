#!/usr/bin/env bash
# Quick start 2: set up (with test tools and redis-server), then run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
exec .venv/bin/python -m pytest -q "$@"
