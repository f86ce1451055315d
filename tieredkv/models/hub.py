"""Hub ids (`ORG/NAME`) found in the local Hugging Face cache; nothing is ever downloaded.

The cache is the one huggingface_hub and transformers use, read when a model is asked for (so a changed
environment counts): $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
$XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub. A model there sits in
`models--ORG--NAME/snapshots/<commit>/`, with `refs/main` naming the commit; that snapshot directory is
then loaded like any local model directory.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from tieredkv.errors import ModelNotFoundError

_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # what the Hub accepts, minus the checks it makes itself


def is_hub_id(name: str) -> bool:
    """`ORG/NAME` spelled as the Hub spells repository ids (the caller has checked it is not a directory)."""
    return bool(_REPO_ID.fullmatch(name)) and ".." not in name and not name.endswith((".", "-"))


def hub_cache_dir() -> Path:
    """The local Hugging Face hub cache, resolved from the environment as huggingface_hub resolves it."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return _expand(os.environ[var])
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return _expand(home) / "hub"


def _expand(path: str) -> Path:
    return Path(os.path.expandvars(os.path.expanduser(path)))


def hub_snapshot(repo_id: str) -> Path:
    """The snapshot directory of `repo_id`'s main revision in the local cache, or ModelNotFoundError."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    cache = hub_cache_dir()
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError as exc:
        held = "holds an incomplete copy of it" if "incomplete" in str(exc) else "does not hold it"
        raise ModelNotFoundError(
            f"{repo_id!r} is not a local directory and the local Hugging Face cache ({cache}) {held}; nothing "
            f"is downloaded at run time: run `hf download {repo_id}` on a machine with network (HF_HUB_CACHE "
            "pointing at this cache) or pass a local model directory"
        ) from None
    except HFValidationError as exc:
        raise ModelNotFoundError(f"{repo_id!r} is not a Hugging Face repository id ({exc}); give ORG/NAME "
                                 "or a local model directory") from None
