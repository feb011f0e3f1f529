"""``python -m dppo`` is the same as the ``dppo`` command."""

from dppo.commands.parser import entry

entry()
