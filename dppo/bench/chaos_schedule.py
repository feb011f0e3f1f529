"""The seeded kill schedule of `dppo bench chaos`: which kind of process dies (or hangs) when.

Each kind's kills are spread evenly over the run with seeded jitter (one kill at a random moment of each of
``rate x minutes`` equal slots), so a rate gives its count exactly and a seed gives the same schedule again; the
victim of each kill is drawn at the moment it is due, from that kind's processes alive then. Pure: no Ray, no
processes, so the schedule is tested on its own.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from dppo.errors import UsageError

# Each kind and the process it kills: the Ray actor class name (its process title is ``ray::<Class>...``), a
# worker node (its whole `ray start` process tree), the driver (the job's entrypoint, `dppo train`), or a hang: any
# process of the Ray actor classes stopped with SIGSTOP and never resumed (the run must notice and replace it).
ACTOR_CLASSES = {"actor": "Actor", "learner": "Learner", "inference": "InferenceService", "evaluation": "Evaluator"}
KINDS = (*ACTOR_CLASSES, "node", "driver", "hang")
DEFAULT_RATES = {"actor": 1.2, "learner": 1.2, "inference": 1.2, "evaluation": 1.2, "node": 0.2, "driver": 1.2,
                 "hang": 1.2}


@dataclass(frozen=True)
class Kill:
    """One planned kill: ``at_s`` seconds after the chaos starts, of a process of ``kind``."""

    at_s: float
    kind: str


def parse_kinds(text: str) -> list[str]:
    """"actor,node" -> ["actor", "node"]; an unknown kind is a usage error naming the known ones."""
    kinds = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown or not kinds:
        raise UsageError(f"--kinds {text!r}: unknown kind {', '.join(unknown) or '(none given)'}; "
                         f"choose from {','.join(KINDS)}")
    return list(dict.fromkeys(kinds))


def parse_rates(items: list[str], kinds: list[str]) -> dict[str, float]:
    """``["node=0.5"]`` over the defaults, for ``kinds`` only; a rate is kills per minute, >= 0."""
    rates = {kind: DEFAULT_RATES[kind] for kind in kinds}
    for item in items:
        kind, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--rate {item!r} is not KIND=PER_MIN, e.g. --rate node=0.2")
        if kind not in KINDS:
            raise UsageError(f"--rate {item!r}: unknown kind {kind!r}; choose from {','.join(KINDS)}")
        if kind not in kinds:
            raise UsageError(f"--rate {item!r}: {kind} is not in --kinds {','.join(kinds)}; add it there")
        try:
            rate = float(value)
        except ValueError:
            raise UsageError(f"--rate {item!r}: {value!r} is not a number of kills per minute") from None
        if not rate >= 0:  # also NaN
            raise UsageError(f"--rate {item!r}: a rate must be >= 0 kills per minute")
        rates[kind] = rate
    return rates


def make_schedule(rates: dict[str, float], minutes: float, seed: int) -> list[Kill]:
    """Every kill of the run in time order: ``round(rate x minutes)`` per kind, one at a uniformly random moment
    of each equal slot of the run (seeded per kind, so adding a kind leaves the others' moments as they were)."""
    kills = []
    span = minutes * 60.0
    for kind, rate in rates.items():
        count = round(rate * minutes)
        rng = random.Random(f"{seed}:{kind}")
        slot = span / count if count else 0.0
        kills += [Kill(round(slot * (i + rng.random()), 3), kind) for i in range(count)]
    return sorted(kills, key=lambda kill: (kill.at_s, KINDS.index(kill.kind)))


def pick(candidates: list[int], seed: int, index: int) -> int:
    """The victim of the ``index``-th kill among ``candidates`` (pids): seeded, and independent of their order."""
    ordered = sorted(candidates)
    return ordered[random.Random(f"{seed}:victim:{index}").randrange(len(ordered))]


def write_schedule(path: Path, planned: list[Kill], done: list[dict[str, object]], settings: dict[str, object],
                   missed: list[dict[str, object]] | None = None) -> None:
    """The schedule beside the results: the settings, what was planned, what was done (victim, time) and what was
    not (why)."""
    path.write_text(json.dumps({"settings": settings, "planned": [asdict(k) for k in planned], "kills": done,
                                "not_done": missed or []}, indent=1) + "\n")
