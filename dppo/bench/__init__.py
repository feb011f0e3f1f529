"""`dppo bench`: one module per benchmark; the helpers they share are public.

Benchmarks are commands that print a table and write numbers (``--json FILE``, ``--write-docs``): they
never assert a time. ``--write-docs`` replaces the command's own section of docs/benchmarks.md
(:mod:`dppo.bench.docs`). The measuring functions take an ``address`` so tests can run them on a shared
local Ray cluster. :mod:`dppo.bench.common` and :mod:`dppo.bench.memory` hold what the benchmarks share.
"""
