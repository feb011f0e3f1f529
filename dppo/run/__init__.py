"""One training run on the driver: the coordinator loop, run state, run directory, reporting, checkpoints."""
