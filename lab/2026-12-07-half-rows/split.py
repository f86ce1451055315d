"""lab/2026-12-07-flat-decode/flat_decode.py with more functions timed inside the main context's steps.

    taskset -c 1 env PYTHONPATH=. python lab/2026-12-07-half-rows/split.py --contexts 8192,1048576 --steps 60 \
        --split --out lab/2026-12-07-half-rows/<name>.json
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-12-07-flat-decode"))
import flat_decode as fd  # noqa: E402

fd.TIMED += ["index.bound_scan:BoundRows.candidates", "index.page_index:quest_bound", "index.page_index:_top_pages",
             "index.page_index:PageIndex._check_queries",
             "tieredkv.engine.kv_buffer:WorkingSetBuffer._arrange_in_place", "paging.host_tier:HostTier.layer_bytes",
             "tieredkv.engine.tiered_cache:TieredCache._stacked_pages",
             "tieredkv.engine.tiered_cache:TieredCache._fill"]

if __name__ == "__main__":
    fd.main()
