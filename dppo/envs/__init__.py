"""Making envs from a config, and the small ``dppo/`` test envs (registered on import)."""

import dppo.envs.testing  # noqa: F401 - registers dppo/Counter-v0 and dppo/Faulty-v0
