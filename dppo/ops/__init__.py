"""Running a run: checkpoints, metrics, logs, status, the dashboard and evaluation."""
