"""The evidence: run records (their schema and their store), source hashes that tell whether a record is still
current, the statistics and the verdicts computed from records. Imports and runs on a CPU."""
