"""`dppo bench`: the diagnostics a user runs on their own machine or cluster, one module each; the helpers they
share are public.

Benchmarks are commands that print a table and write numbers (``--json FILE``, ``--write-docs``): they
never assert a time. ``--write-docs`` replaces the command's own section of docs/benchmarks.md
(:mod:`dppo.bench.docs`). The measuring functions take an ``address`` so tests can run them on a shared
local Ray cluster. :mod:`dppo.bench.common`, :mod:`dppo.bench.memory` and :mod:`dppo.bench.runs` hold what the
benchmarks share. What reproduces the docs' figures (learning tables, peers, self-play, sweeps) is not
installed: it is a clone's ``benchmarks/`` (``python -m benchmarks``), built on these helpers.
"""
