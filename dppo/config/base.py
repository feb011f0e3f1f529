"""What every config section shares: strict keys, docstrings as field descriptions, one-line errors."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from dppo.errors import UsageError


class ConfigError(UsageError):
    """Bad configuration: the message is one line that names the field and how to fix it."""


class Section(BaseModel):
    """Strict base: unknown keys are errors (a typo must not silently fall back to a default)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)
