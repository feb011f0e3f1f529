"""What every config section shares: strict keys, docstrings as field descriptions, one-line errors.

A config that pydantic rejects is reported whole, in one line: every unknown key (with the key the user most
likely meant) and every bad value, so a user fixes a file or a command line in one go, not one error per run.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from dppo.errors import UsageError


class ConfigError(UsageError):
    """Bad configuration: the message is one line that names the field and how to fix it."""


class Section(BaseModel):
    """Strict base: unknown keys are errors (a typo must not silently fall back to a default)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


_TYPE_ERRORS = {"int_parsing", "float_parsing", "bool_parsing", "int_type", "float_type", "bool_type", "string_type",
                "list_type", "dict_type", "literal_error", "int_from_float"}


def describe(err: ValidationError, root: type[BaseModel], aliases: Mapping[str, str],
             key_list: str = "dppo train --help lists the keys") -> str:
    """Every problem of ``err`` in one line: unknown keys first, each with a "did you mean", then bad values.

    ``aliases``: names other libraries give our keys (``lr``) -> our dotted key (``ppo.learning_rate``);
    ``key_list``: where the user finds every key."""
    unknown, values, seen = [], [], set()
    for error in err.errors():
        if error["loc"] in seen:  # a union reports one location once per member
            continue
        seen.add(error["loc"])
        if error["type"] == "extra_forbidden":
            unknown.append(unknown_key(root, error["loc"], error["input"], aliases))
        else:
            values.append(bad_value(error))
    parts = []
    if unknown:
        keys = listed(unknown, "and")
        parts.append(f"unknown key{'s' if len(unknown) > 1 else ''} {keys}; check the spelling "
                     f"({key_list})")
    return "; ".join(parts + values)


def bad_value(error: Mapping[str, Any]) -> str:
    """``section.key: what is wrong (got value)`` for one rejected value."""
    loc = dotted(error["loc"]) or "config"
    msg = error["msg"].removeprefix("Value error, ")
    if loc == "config":
        return msg
    if error["type"] in _TYPE_ERRORS or ("input" in error and not isinstance(error["input"], dict)):
        return f"{loc}: {msg} (got {error.get('input')!r})"
    return f"{loc}: {msg}"


def unknown_key(root: type[BaseModel], loc: Sequence[str | int], value: Any, aliases: Mapping[str, str]) -> str:
    """``'ppo.lr' (did you mean ppo.learning_rate?)``: the key as written, and the likeliest meant key if any.

    An unknown section holding one key (``--set rn.actors=2``) is named with that key, as the user wrote it."""
    *parent, key = [str(part) for part in loc]
    if not parent and isinstance(value, dict):
        inner = str(next(iter(value))) if len(value) == 1 else None
        named, meant = (key if inner is None else f"{key}.{inner}"), meant_section(root, key, inner)
    else:
        named, meant = dotted(loc), meant_key(root, parent, key, aliases)
    return f"{named!r}" + (f" (did you mean {meant}?)" if meant else "")


def meant_key(root: type[BaseModel], parent: list[str], key: str, aliases: Mapping[str, str]) -> str | None:
    """The key most likely meant by ``key`` in the section at ``parent``: another library's name for it, the same
    key in another section, a near spelling, the keys it begins (``clip``: clip_coef or clip_value_loss), a looser
    spelling, or the key it abbreviates (``lr``)."""
    fields = list(section_fields(root, parent) or {})
    prefix = ".".join([*parent, ""])
    if len(parent) > 1:  # inside a list item (env.wrappers.0): only its own keys
        aliases = {}
    elif key in aliases:
        return aliases[key]
    else:  # a top-level key or a section's: the same key in another section
        elsewhere = [f"{section}.{key}" for section in root.model_fields
                     if key in (section_fields(root, [section]) or {})]
        if len(elsewhere) == 1:
            return elsewhere[0]
    candidates = [*fields, *aliases]
    near = difflib.get_close_matches(key, candidates, n=1, cutoff=0.85)
    begun = [name for name in fields if len(key) >= 3 and name.startswith(key)]
    if not near and 0 < len(begun) <= 4:
        return listed([prefix + name for name in begun], "or")
    near = near or difflib.get_close_matches(key, candidates, n=1) or [
        name for name in fields if initials(name) == key][:1]
    if not near:
        return None
    return prefix + near[0] if near[0] in fields else aliases[near[0]]


def meant_section(root: type[BaseModel], section: str, key: str | None) -> str | None:
    """For an unknown section holding ``key`` (None: several keys): ``section.key`` with the section's likeliest
    spelling (or the one section that has ``key``), or the section alone when ``key`` is not one of its keys."""
    close = difflib.get_close_matches(section, list(root.model_fields), n=1)
    if close:
        return f"{close[0]}.{key}" if key in (section_fields(root, close) or {}) else close[0]
    holders = [name for name in root.model_fields if key in (section_fields(root, [name]) or {})]
    return f"{holders[0]}.{key}" if len(holders) == 1 else None


def section_fields(root: type[BaseModel], path: Sequence[str]) -> dict[str, Any] | None:
    """The fields of the section at ``path`` (list items skipped: ``env.wrappers.0``), None if it is not one."""
    model = root
    for part in path:
        if part.isdigit():
            continue
        field = model.model_fields.get(part)
        section = field and model_in(field.annotation)
        if section is None:
            return None
        model = section
    return dict(model.model_fields)


def model_in(annotation: Any) -> type[BaseModel] | None:
    """The section type in an annotation such as ``EnvConfig``, ``list[WrapperConfig]`` or ``X | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (list, typing.Union, types.UnionType):
        return next((m for arg in typing.get_args(annotation) if (m := model_in(arg)) is not None), None)
    return None


def initials(name: str) -> str:
    """``learning_rate`` -> ``lr``: how people abbreviate a key."""
    return "".join(word[0] for word in name.split("_") if word)


def listed(items: Sequence[str], word: str) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {word} {items[-1]}"


def dotted(loc: Sequence[str | int]) -> str:
    return ".".join(str(part) for part in loc)
