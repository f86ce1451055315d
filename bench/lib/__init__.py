"""What the benchmarks share: the report (environment, hashes, recipe, atomic write), timers and machine
ceilings, and the page-search probe of `memory_vs_context`."""
