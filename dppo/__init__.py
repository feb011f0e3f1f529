"""dppo: distributed PPO on Ray, from a laptop to a KubeRay cluster."""

__version__ = "0.1.0"
