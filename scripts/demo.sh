#!/usr/bin/env bash
# Quick start 1: set up, then answer a question about a long document (the statements chapter of
# the Python language reference, ~11K tokens, longer than SmolLM2's 8K window) with the embedded
# model. The first run ingests the document into the store; later runs graft it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/tieredkv qa "$@"
