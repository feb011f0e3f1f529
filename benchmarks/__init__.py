"""What reproduces the docs' figures, run from a clone (``python -m benchmarks NAME ...``; not installed with dppo).

One module per benchmark, each with ``register(subparsers)`` like `dppo bench`'s diagnostics, whose helpers
(:mod:`dppo.bench.common`, :mod:`dppo.bench.docs`, :mod:`dppo.bench.runs`) they use; dppo never imports them.
``--write-docs`` writes the benchmark's own section of docs/benchmarks.md with the command that made it.
"""
