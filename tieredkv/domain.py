"""The determinism domain: everything that must match for two runs to give the same bytes."""
from __future__ import annotations

import hashlib
import json
import platform
from typing import Any

import torch
import transformers

from tieredkv.errors import DomainMismatchError

# Fields that decide floats; "fingerprint" is checked separately (with its own error).
DOMAIN_FIELDS = ("fingerprint", "dtype", "device_kind", "torch", "transformers", "attn_implementation",
                 "num_threads", "page_size", "machine", "tieredkv_format")
TIEREDKV_FORMAT = 1


def device_kind(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return "cuda:" + torch.cuda.get_device_name(device)
    return f"{device.type}:{platform.processor() or platform.machine()}"


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
    }


def domain_id(domain: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(domain, sort_keys=True).encode()).hexdigest()[:16]


def domain_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    return [f"{k}: {recorded.get(k)!r} -> {current.get(k)!r}"
            for k in DOMAIN_FIELDS if recorded.get(k) != current.get(k)]


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
