"""Support code shared by the tests and the benchmarks (not shipped in the wheel): fault-injection
children (`faults`), a real Redis/Valkey server for the remote tier (`redis_server`), and the
fresh-vs-grafted logits of a child process (`graft_child`)."""
