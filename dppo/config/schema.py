"""The config as a JSON schema, for the Helm chart's values.schema.json: the chart's `config:` values are
checked at `helm install` with the rules `dppo train` applies (unknown keys, types, ranges), instead of failing
when the job starts on the cluster, after its pods were scheduled. Generated from the pydantic models, never
written twice: references inlined (one self-contained schema), titles dropped, the string shorthand of a
wrapper allowed, numbers also written as 1e6 (as YAML 1.1 reads them and dppo accepts them), and the renamed
keys still accepted under their old names."""

from __future__ import annotations

import copy
from typing import Any

from dppo.config.load import _SCIENTIFIC, RENAMED
from dppo.config.root import Config

E_NOTATION = {"type": "string", "pattern": _SCIENTIFIC.pattern}


def config_schema() -> dict[str, Any]:
    """The JSON schema of a whole config (every key optional: the chart merges the values over a preset)."""
    raw = Config.model_json_schema()
    definitions = raw.pop("$defs")
    schema = inline(raw, definitions)
    wrappers = schema["properties"]["env"]["properties"]["wrappers"]
    wrappers["items"] = {"anyOf": [{"type": "string", "minLength": 1}, wrappers["items"]]}
    for (section, old), new in RENAMED.items():
        fields = schema["properties"][section]["properties"]
        fields[old] = {**copy.deepcopy(fields[new]), "description": f"Deprecated name of {section}.{new}."}
    return schema


def inline(node: Any, definitions: dict[str, Any]) -> Any:
    """``node`` with every $ref replaced by its definition, titles dropped, numbers also in e-notation."""
    if isinstance(node, list):
        return [inline(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return inline(definitions[node["$ref"].rsplit("/", 1)[1]], definitions)
    out = {key: inline(value, definitions) for key, value in node.items() if key != "title"}
    if out.get("type") in ("integer", "number"):
        number = {key: out.pop(key) for key in list(out) if key not in ("description", "default")}
        out["anyOf"] = [number, E_NOTATION]
    return out
