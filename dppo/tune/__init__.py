"""`dppo tune`: the fastest settings for an env measured on the machine (or cluster) it runs on.

Which data path is fastest (the policy in the actors, in two halves, on a GPU share, in the inference service), and
with how many actors and envs, depends on the machine: on an H100 with 16 cores the service sampled Breakout at
0.46x of the actors (issue 42), on 2 cores at 0.81-0.87x. This package measures instead of guessing:
:mod:`dppo.tune.grid` (the options), :mod:`dppo.tune.measure` (one option sampled, its update timed, or trained),
:mod:`dppo.tune.search` (within a time budget); :mod:`dppo.config.tuned` keeps the result for ``auto``.
"""
