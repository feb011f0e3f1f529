"""Making envs from a config (registered ids, module:EnvId, entry points, wrappers) and the test envs."""

import dppo.envs.toy  # noqa: F401 - registers the dppo/ test envs
