"""Regenerate the vendored CRD JSON schemas the chart tests validate rendered objects against.

Reads CustomResourceDefinition YAML files (KubeRay's ray-operator/config/crd/bases/ and the Prometheus
Operator's example/prometheus-operator-crd/ at the versions in VERSIONS) and writes, for every served
version, ``<group>/<kind>_<version>.json``: the version's openAPIV3Schema (kubeconform's layout).

    python tests/deploy/schemas/update.py CRD.yaml [CRD.yaml ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).parent


def write_schemas(crd_path: Path) -> list[Path]:
    crd = yaml.safe_load(crd_path.read_text())
    spec = crd["spec"]
    written = []
    for version in spec["versions"]:
        if not version.get("served") or version["name"] != "v1":
            continue
        out = HERE / spec["group"] / f"{spec['names']['kind'].lower()}_{version['name']}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(version["schema"]["openAPIV3Schema"], indent=1, sort_keys=True) + "\n")
        written.append(out)
    return written


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    for arg in sys.argv[1:]:
        for path in write_schemas(Path(arg)):
            print(path.relative_to(HERE))
