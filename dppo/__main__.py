"""``python -m dppo`` is the same as the ``dppo`` command."""

from dppo.cli import entry

entry()
