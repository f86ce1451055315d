"""The attention engine: a Cache subclass over the page store, the attention function, placement.

    tiered_model.py   TieredModel: ingest, graft, generate over one growing context
    tiered_cache.py   the transformers Cache subclass: sealing pages, layer kinds, the working set
    tiered_config.py  what goes into the working set (TieredConfig, ReadingConfig)
    placement.py      which pages a full-attention layer attends to, and where
    attention.py      the attention function registered with transformers (ContextVar to the cache)
    working_set.py    spans and masks from absolute positions (pure functions)
    kv_buffer.py      one layer's working set as one device buffer, updated in place
    head_block.py     per-head pages in one buffer slot (retrieval="per_head")
    rotary.py         moving post-rotary keys to other positions (the one inexact operation)
    prefetch.py       pages read beside compute
    schedule.py       the canonical, page-aligned chunk schedule
"""
