"""Sweeps: many dppo runs on one cluster, searched and scheduled by Ray Tune."""
