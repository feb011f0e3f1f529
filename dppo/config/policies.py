"""The ``policies`` map: which agents of a multi-agent env each named policy acts and trains for.

Empty (the default), one policy named :data:`DEFAULT_POLICY` acts for every agent (parameter sharing). Else each
entry names a policy and the agent-name patterns (shell-style, ``adversary_*``) whose agents it acts for: each
policy has its own network, optimizer, normalizer statistics, checkpoint entry, export and metrics, and may see
spaces other policies do not. Which agents a pattern matches is only known once the env is made
(:mod:`dppo.envs.policy_map`); here, what the names and patterns must look like.
"""

from __future__ import annotations

import re

DEFAULT_POLICY = "default"  # the one policy of a run without a policy map (a single-agent env's too)
POLICY_SEED_OFFSET = 3_001  # each policy's action stream, apart from the others' (the env's is the actor's)
POLICY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,62}")  # in metric labels, file names and checkpoint keys
POLICIES_EXAMPLE = "policies: {adversary: ['adversary_*'], agent: ['agent_*']}"


def check_policies(policies: dict[str, list[str]]) -> None:
    """ValueError naming the first bad policy name or pattern list (the message is the config's one line)."""
    for name, patterns in policies.items():
        if not POLICY_NAME.fullmatch(name):
            raise ValueError(f"policy name {name!r} must start with a letter or _ and hold only letters, digits, _ "
                             f"and - (it names metric labels and exported files); e.g. {POLICIES_EXAMPLE}")
        if not patterns or any(not isinstance(p, str) or not p.strip() for p in patterns):
            raise ValueError(f"policies.{name} must list agent-name patterns (e.g. ['adversary_*']); got "
                             f"{patterns!r}")
