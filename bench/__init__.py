"""Step-time benchmarks of the seed designs: `pytest bench --benchmark-only` (see README.md).

A package, so its modules import as `bench.*` and cannot shadow a test
module of the same name elsewhere in the repository.
"""
