"""The determinism domain: everything that must match for two runs to give the same bytes."""
from __future__ import annotations

import functools
import hashlib
import json
import platform
import re
from typing import Any

import torch
import transformers

from tieredkv.errors import DomainMismatchError

# Fields that decide floats; "fingerprint" is checked separately (with its own error).
# NOTE: "machine" and "device_kind" say little on their own (an Intel Xeon and an AMD EPYC are both
# cpu:x86_64, and their GEMM kernels differ): the CPU, the kernel set torch picked, the BLAS and oneDNN
# builds and, on CUDA, the device, its compute capability and the CUDA/cuDNN versions are recorded too.
DOMAIN_FIELDS = ("fingerprint", "dtype", "device_kind", "torch", "transformers", "attn_implementation",
                 "num_threads", "page_size", "machine", "tieredkv_format", "cpu", "cpu_capability", "blas",
                 "onednn", "cuda")
TIEREDKV_FORMAT = 1


def device_kind(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return "cuda:" + torch.cuda.get_device_name(device)
    return f"{device.type}:{platform.processor() or platform.machine()}"


@functools.lru_cache(maxsize=1)
def cpu_name() -> str:
    """Vendor and model of this CPU ("GenuineIntel Intel(R) Xeon(R) ..."), as the OS reports them."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor is enough
                name, _, value = line.partition(":")
                fields.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    vendor = fields.get("vendor_id") or fields.get("CPU implementer") or ""
    model = fields.get("model name") or fields.get("Model") or fields.get("CPU part") or ""
    if not model and platform.system() == "Darwin":
        import subprocess

        try:
            model = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                   timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            model = ""
    return " ".join(p for p in (vendor, model) if p) or platform.processor() or platform.machine() or "unknown"


@functools.lru_cache(maxsize=1)
def _build_libraries() -> tuple[str, str]:
    """(BLAS, oneDNN) versions of this torch build, from torch.__config__.show()."""
    text = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", text)
    mkl = re.search(r"Math Kernel Library Version ([^\n]+?) for", text)
    blas_text = (blas.group(1) if blas else "unknown") + (f" {mkl.group(1).strip()}" if mkl else "")
    onednn = re.search(r"(?:MKL-DNN|oneDNN) v?([0-9][^\s]*)", text)
    return blas_text, onednn.group(1) if onednn else "none"


def float_environment(device: torch.device | str) -> dict[str, Any]:
    """The fields of this machine and build that change floats (see DOMAIN_FIELDS)."""
    device = torch.device(device)
    blas, onednn = _build_libraries()
    cuda = None
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        cuda = {"device": torch.cuda.get_device_name(device), "capability": f"{major}.{minor}",
                "cuda": torch.version.cuda, "cudnn": cudnn}
    return {"cpu": cpu_name(), "cpu_capability": torch.backends.cpu.get_cpu_capability(), "blas": blas,
            "onednn": onednn, "cuda": cuda}


def determinism_domain(model, fingerprint: str, page_size: int) -> dict[str, Any]:
    """The domain of `model` running with this process's settings and this chunk schedule."""
    return {
        "fingerprint": fingerprint,
        "dtype": str(model.dtype).replace("torch.", ""),
        "device_kind": device_kind(model.device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attn_implementation": model.config._attn_implementation,
        "num_threads": torch.get_num_threads(),
        "page_size": int(page_size),
        "machine": platform.machine(),
        "tieredkv_format": TIEREDKV_FORMAT,
        **float_environment(model.device),
    }


def domain_id(domain: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(domain, sort_keys=True).encode()).hexdigest()[:16]


def domain_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Each field that differs, as "name: recorded -> current". A field the record lacks (an older
    tieredkv did not record it) counts as different: nothing says the two machines agree on it."""
    out = []
    for k in DOMAIN_FIELDS:
        if k not in recorded and k in current:
            out.append(f"{k}: not recorded (made by an older tieredkv) -> {current[k]!r}")
        elif recorded.get(k) != current.get(k):
            out.append(f"{k}: {recorded.get(k)!r} -> {current.get(k)!r}")
    return out


def check_domain(recorded: dict[str, Any], current: dict[str, Any], *, allow_mismatch: bool, what: str) -> list[str]:
    """Refuse a cross-domain graft unless explicitly allowed; return the differences either way."""
    diffs = domain_differences(recorded, current)
    if diffs and not allow_mismatch:
        raise DomainMismatchError(
            f"{what} was made in another determinism domain ({'; '.join(diffs)}); the logits would not be "
            "byte-exact. Re-deposit here, or pass allow_domain_mismatch=True / --allow-domain-mismatch to "
            "graft anyway without the guarantee."
        )
    return diffs


def sha256_tensor(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's dtype, shape and raw bytes."""
    t = t.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def sha256_ids(ids) -> str:
    import numpy as np

    return hashlib.sha256(np.asarray(list(ids), dtype="<i4").tobytes()).hexdigest()
