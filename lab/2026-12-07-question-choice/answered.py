"""Which of the 60 questions each working-set system answered at 4K and 8K (run `window` of
bench/results/longdoc_qa.json), and where the evidence page was: -> answered.json."""
import json
from pathlib import Path

SYSTEMS = ("full", "ws25", "ws25-lex", "ws12-lex", "ws25-q", "ws12-q", "ws25-hyb", "ws12-d2", "ws12-lex-d2", "oracle25",
           "tiered-read", "ceiling")
rows = json.loads(Path("bench/results/longdoc_qa.json").read_text())["runs"]["window"]["rows"]
out = {}
for length in ("4k", "8k"):
    mine = [r for r in rows if r["length"] == length and r["system"] in SYSTEMS]
    out[length] = {s: {"answered": sorted(r["id"] for r in mine if r["system"] == s and r["correct"]),
                       "evidence_layers_mean": (round(sum(r["evidence_layers"] for r in mine if r["system"] == s)
                                                      / max(1, sum(r["system"] == s for r in mine)), 1)
                                                if s.startswith(("ws", "oracle")) else None),
                       "output_ids_sha256": {r["id"]: r["output_ids_sha256"] for r in mine if r["system"] == s}}
                   for s in SYSTEMS}
Path(__file__).with_name("answered.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
for length, systems in out.items():
    for s, d in systems.items():
        print(length, f"{s:12s}", len(d["answered"]), d["evidence_layers_mean"], " ".join(d["answered"]))
