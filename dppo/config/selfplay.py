"""The ``selfplay`` section: how a two-player turn-based game (a PettingZoo AEC env) is trained against frozen
snapshots of the policy itself. It applies only to such games; other envs ignore it."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from dppo.config.base import Section

FIXED_PLAYER = re.compile(r"random|minimax(:[1-9][0-9]*)?")  # the players a policy is judged against
FIXED_PLAYER_HINT = "random, minimax or minimax:DEPTH (a whole number >= 1, e.g. minimax:4)"


def fixed_player(spec: str) -> tuple[str, int | None]:
    """``random`` / ``minimax`` / ``minimax:DEPTH`` -> (kind, depth); ValueError for anything else."""
    if not FIXED_PLAYER.fullmatch(spec):
        raise ValueError(f"{spec!r} is not a fixed player: write {FIXED_PLAYER_HINT}")
    kind, _, depth = spec.partition(":")
    return kind, int(depth) if depth else None


class SelfPlayConfig(Section):
    snapshot_every: int = Field(10, ge=1)
    """Add a frozen snapshot of the policy to the opponent pool every this many iterations (the initial policy is
    the first snapshot)."""
    pool_size: int = Field(20, ge=1)
    """Snapshots kept in the pool; the oldest is dropped when a new one would exceed it."""
    opponents: Literal["latest", "uniform", "win_rate"] = "win_rate"
    """How each game's opponent is drawn from the pool: latest (the newest snapshot only), uniform, or win_rate
    (prioritized fictitious self-play: weight (1 - the learner's win rate against it)^2, so the snapshots it has not
    yet beaten are played most)."""
    opponent_epsilon: float = Field(0.0, ge=0, le=1)
    """The share of a snapshot's moves replaced by a uniformly random legal move: lines its own policy would not
    play, so the learner meets (and learns to answer) openings and mistakes its past selves never make."""
    random_opening: int = Field(0, ge=0)
    """Each game starts with 0 to this many uniformly random moves (the number drawn per game; both players' moves,
    before the learner's first), then the learner and its snapshot play on at full strength: the learner meets
    openings neither would choose, as a perfect opponent may, without the weakened opponents of opponent_epsilon
    (against those, risky moves that a perfect player refutes pay). A game the random moves end starts again without
    them."""
    eval_opponent: str = "random"
    """Who the evaluation while training (run.eval_every) plays, seats alternating: random, minimax (a perfect player,
    for games small enough to solve: tic-tac-toe) or minimax:DEPTH; eval_return_mean is then wins minus losses per
    game against it, and best.pt the weights that did best."""
    elo_k: float = Field(16.0, gt=0)
    """The Elo K factor: how far one game moves the learner's and a snapshot's rating."""

    @field_validator("eval_opponent")
    @classmethod
    def _fixed_player(cls, value: str) -> str:
        fixed_player(value)
        return value
