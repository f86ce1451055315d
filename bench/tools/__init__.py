"""Development tools beside the benchmarks, each run as `python -m bench.tools.<name>`: behaviour_hashes (hashes of
what the library computes, before and after a refactor), longdoc_check (the QA sets against their corpora) and
add_recipe (a recheck recipe for a report made before its benchmark wrote one)."""
