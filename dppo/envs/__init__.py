"""Making envs from a config (ids, module:EnvId, entry points, wrappers), Atari, user-code loading, toy envs.

The toy envs of :mod:`dppo.envs.toy` are registered here by name, so ``dppo/Counter-v0`` and the others can
be made in any process that imports this package, without importing their module until one is made. Importing
it stays cheap (gymnasium only, no torch or Ray): a user's script names it as it would any env package, since
gymnasium 1.x has no plugin entry points, ``gym.make("dppo.envs:dppo/CueCorridor-v0")``.
"""

import gymnasium as gym

TOY_ENVS = {
    "dppo/Counter-v0": ("CounterEnv", {}, 10),
    "dppo/Faulty-v0": ("FaultyEnv", {}, 500),
    "dppo/MatchBits-v0": ("MatchEnv", {"kind": "bits"}, None),
    "dppo/MatchDigits-v0": ("MatchEnv", {"kind": "digits"}, None),
    "dppo/DictMatch-v0": ("MatchEnv", {"kind": "dict"}, None),
    "dppo/MaskedGrid-v0": ("MaskedGrid", {}, 50),
    "dppo/CueCorridor-v0": ("CueCorridor", {}, 100),
    "dppo/Frames-v0": ("FramesEnv", {}, 200),
    "dppo/InfoCartPole-v0": ("InfoCartPole", {}, 500),
}

for _env_id, (_cls, _kwargs, _limit) in TOY_ENVS.items():
    if _env_id not in gym.registry:
        gym.register(_env_id, entry_point=f"dppo.envs.toy:{_cls}", kwargs=_kwargs, max_episode_steps=_limit)
