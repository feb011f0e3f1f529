"""The self-play league of a two-player game: the pool of frozen snapshots the learner plays against, each
snapshot's record against the learner, and Elo ratings. The driver owns it; the actors get a
:class:`~dppo.rl.opponents.PoolView` of it each round and send back ``(opponent id, score)`` per finished game.

Ratings: the learner starts at :data:`START_ELO`; a snapshot enters with the learner's rating at that moment and
both move by ``selfplay.elo_k x (score - expected)`` per game, one game after another in the order the actors'
segments list them (a whole round applied at once against one expectation overshoots: hundreds of games a
round). The learner's rating rising while it keeps beating ever newer snapshots is the curve self-play is judged
by. The pool, records and ratings go into the checkpoint, so a resumed run continues the same league.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from dppo.config import SelfPlayConfig
from dppo.rl.agent import Weights
from dppo.rl.opponents import PoolView

START_ELO = 1000.0


@dataclass
class Snapshot:
    """A frozen policy in the pool and the learner's record against it."""

    id: int
    iteration: int
    weights: Weights
    elo: float
    games: int = 0
    score: float = 0.0  # the learner's points against it (win 1, draw 0.5)

    @property
    def win_rate(self) -> float:
        """The learner's smoothed score against it (1/2 with no games: Laplace's rule)."""
        return (self.score + 1.0) / (self.games + 2.0)


def expected(rating: float, other: float) -> float:
    """Elo's expected score of ``rating`` against ``other``."""
    return 1.0 / (1.0 + 10.0 ** ((other - rating) / 400.0))


class League:
    """The snapshot pool, the records and the ratings of one self-play run."""

    def __init__(self, config: SelfPlayConfig) -> None:
        self.config = config
        self.snapshots: list[Snapshot] = []
        self.elo = START_ELO
        self.next_id = 0

    def add(self, weights: Weights, iteration: int) -> None:
        """A frozen copy of ``weights`` joins the pool at the learner's rating; the oldest leaves a full pool."""
        frozen = {key: np.array(value) for key, value in weights.items()}
        self.snapshots.append(Snapshot(self.next_id, iteration, frozen, self.elo))
        self.next_id += 1
        del self.snapshots[:-self.config.pool_size]

    def due(self, iteration: int) -> bool:
        """A snapshot is taken at the start and every selfplay.snapshot_every iterations."""
        if not self.snapshots:
            return True
        return iteration % self.config.snapshot_every == 0 and self.snapshots[-1].iteration != iteration

    def probs(self) -> list[float]:
        """The chance each snapshot is the next game's opponent (selfplay.opponents)."""
        count = len(self.snapshots)
        if self.config.opponents == "latest":
            return [0.0] * (count - 1) + [1.0]
        if self.config.opponents == "uniform":
            return [1.0 / count] * count
        weights = np.array([(1.0 - s.win_rate) ** 2 for s in self.snapshots]) + 1e-3
        return (weights / weights.sum()).tolist()

    def view(self) -> PoolView:
        return PoolView([s.id for s in self.snapshots], [s.weights for s in self.snapshots], self.probs())

    def record(self, results: np.ndarray) -> dict[str, Any]:
        """This iteration's games in (rows of opponent id, score); the record's self-play keys."""
        by_id = {s.id: s for s in self.snapshots}
        counted = []
        for opponent, score in results.tolist():  # one game at a time, in the order the actors sent them
            snapshot = by_id.get(int(opponent))
            counted.append(score)
            if snapshot is None:  # the random player, or a snapshot dropped since the game was drawn
                continue
            delta = self.config.elo_k * (score - expected(self.elo, snapshot.elo))
            self.elo += delta
            snapshot.elo -= delta
            snapshot.games += 1
            snapshot.score += score
        scores = np.asarray(counted)
        games = len(scores)
        return {
            "selfplay_games": games,
            "selfplay_win_rate": float(np.mean(scores == 1.0)) if games else None,
            "selfplay_draw_rate": float(np.mean(scores == 0.5)) if games else None,
            "selfplay_loss_rate": float(np.mean(scores == 0.0)) if games else None,
            "selfplay_elo": round(self.elo, 2), "selfplay_pool_size": len(self.snapshots),
        }

    def to_state(self) -> dict[str, Any]:
        """The league as a checkpoint holds it (types ``torch.load(weights_only=True)`` accepts)."""
        return {"elo": self.elo, "next_id": self.next_id,
                "snapshots": [{**asdict(s), "weights": {k: torch.from_numpy(np.array(v)) for k, v in s.weights.items()}}
                              for s in self.snapshots]}

    def restore(self, saved: dict[str, Any]) -> None:
        self.elo, self.next_id = float(saved["elo"]), int(saved["next_id"])
        self.snapshots = [Snapshot(**{**s, "weights": {k: np.asarray(v.numpy()) for k, v in s["weights"].items()}})
                          for s in saved["snapshots"]]

    def snapshot(self, snapshot_id: int) -> Snapshot:
        """A snapshot by id (``dppo eval --opponent snapshot:N``), or KeyError."""
        for s in self.snapshots:
            if s.id == snapshot_id:
                return s
        raise KeyError(snapshot_id)
