"""Artifacts: a deposited context as a manifest over byte-exact pages.

    record.py       the artifact record and its manifest format (id, chain fingerprint, field checks)
    manifest.py     manifests read against a store: verified, chained, read back after a write
    artifact.py     deposit (canonical prefill, pages sealed) and graft (own positions) into HF caches
    file_format.py  the portable file: a bounded JSON header, then pages (safetensors-style, no pickle)
    portable.py     export / import of those files, verified before a byte reaches the store
    check.py        `tieredkv check`: re-hash stored pages and manifests, quarantine what fails
    capture.py      the DynamicCache subclass that hands sealed K/V to deposit
"""
