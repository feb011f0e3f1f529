"""The chart refuses what `helm install` would refuse under `helm lint --strict` too: in values.schema.json where a
schema can say it (an unknown key, with the key meant; Kueue without a queue), by the template's refusal otherwise
(an env id the image does not register, learners.replicas=1), which lint used to log at INFO and pass. Every key of
every fixed section, the config's included, names itself when misspelt."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from conftest import load_module
from runs import REPO

CHART = REPO / "helm" / "dppo"

REFUSED = [
    (["--set", "actor=8"], "at '/actor': value must be 'unknown key: did you mean actors?'"),
    (["--set", "scheduling.queueName=team-a"], "did you mean scheduling.queue?"),
    (["--set", "scheduling.priorityClass=low"], "did you mean scheduling.priorityClassName?"),
    (["--set", "config.ppo.learning_rte=1e-3"], "did you mean config.ppo.learning_rate?"),
    (["--set", "scheduling.admission=kueue"], "scheduling.admission=kueue needs scheduling.queue"),
    (["--set", "env=CartPol-v1"], "env=CartPol-v1 is not an id the chart knows"),
    (["--set", "learners.replicas=1"], "learners.replicas=1: use 0"),
]


def helm(helm_bin: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm_bin, *args], capture_output=True, text=True, timeout=120, cwd=str(Path.cwd()))


@pytest.mark.parametrize(("args", "message"), REFUSED, ids=[a[1] for a, _ in REFUSED])
def test_lint_strict_refuses_what_install_refuses(helm_bin: str, args: list[str], message: str) -> None:
    lint = helm(helm_bin, "lint", "--strict", str(CHART), *args)
    assert lint.returncode != 0 and "[ERROR]" in lint.stdout, lint.stdout + lint.stderr
    assert message in lint.stdout, lint.stdout
    install = helm(helm_bin, "install", "r", str(CHART), "--dry-run=client", *args)
    assert install.returncode != 0 and message in install.stderr, install.stderr


def at(path: str, key: str, value: Any, values: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{a: {b: {key: value}}}`` for the path ``a.b``, merged into ``values`` when given."""
    values = {} if values is None else values
    inner = values
    for part in path.split(".") if path else []:
        inner = inner.setdefault(part, {})
    inner[key] = value
    return values


def test_every_key_misspelt_is_refused_naming_it(helm_bin: str, tmp_path: Path) -> None:
    """Each key of each section of fixed keys, its first letter's case changed and one letter dropped, against the
    chart's real schema, read by Python's jsonschema and by helm (Go's regexp; one call with every misspelling):
    refused, the message naming the key as `--set` writes it."""
    generator = load_module(REPO / "helm" / "values_schema.py")
    schema = json.loads((CHART / "values.schema.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert not list(validator.iter_errors(values))
    sections = {path: list(section["properties"])
                for path, section in generator.fixed_sections(schema, schema["definitions"]).items()
                if not path.startswith("*")}  # a shared definition (resources) is met under its users' paths
    assert {"", "scheduling", "job", "config.ppo", "config.run", "sweep"} <= set(sections)
    typos: dict[str, str] = {}  # '/path/typo' as helm names it -> the key meant
    every_typo: dict[str, Any] = {}
    for path, keys in sections.items():
        for key in keys:
            meant = f"{path}.{key}" if path else key
            for typo in {key[0].swapcase() + key[1:], key[:-1]} - set(keys):
                if len(typo) < 4 and typo == key[:-1]:
                    continue  # too short to be taken for the key cut short
                errors = [e.message for e in validator.iter_errors(at(path, typo, "x"))]
                assert any(f"did you mean {meant}?" in e for e in errors), (meant, typo, errors)
                typos["/" + "/".join([*(path.split(".") if path else []), typo])] = meant
                at(path, typo, "x", every_typo)
    assert len(typos) > 300
    (tmp_path / "typos.yaml").write_text(yaml.safe_dump(every_typo))
    out = helm(helm_bin, "template", "r", str(CHART), "-f", str(tmp_path / "typos.yaml"))
    said: dict[str, set[str]] = {}
    for where, meant in re.findall(r"at '([^']*)': value must be 'unknown key: did you mean ([^']*)\?'", out.stderr):
        said.setdefault(where, set()).add(meant)
    assert not [(where, meant) for where, meant in typos.items() if meant not in said.get(where, set())], out.stderr
