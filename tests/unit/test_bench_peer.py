"""`python -m benchmarks peer`'s pieces without the peer: its output parsed, dppo's config mirrored into the peer's spec
(and refused where it cannot be), an unusable --peer-python caught in one line, the figure and the table's cells."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
from pathlib import Path

import pytest

from benchmarks import peer, peer_rllib
from dppo.config import load_config
from dppo.envs.make import with_agents
from dppo.errors import UsageError
from dppo.run.curves import Curve

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "simple-spread.yaml"


def peer_lines(*records: dict) -> str:
    """What peer_rllib.py prints for ``records`` (its own emit), between lines of RLlib's own output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for record in records:
            print("2026-01-01 WARNING algorithm_config.py -- RLlib's own chatter")
            peer_rllib.emit(**record)
    return out.getvalue()


def test_parses_what_the_peer_script_prints() -> None:
    text = peer_lines({"event": "start", "agents": 3, "t": 10.0, "ray": "2.60.0"},
                      {"event": "iteration", "iteration": 1, "agent_steps": 2400, "t": 11.0,
                       "episode_return_mean": None},
                      {"event": "iteration", "iteration": 2, "agent_steps": 4800, "t": 12.5,
                       "episode_return_mean": -25.5},
                      {"event": "done", "iteration": 2, "agent_steps": 4800, "t": 13.0})
    run = peer.parse_peer_output(text)
    assert run.start["ray"] == "2.60.0" and run.done is not None and run.done["t"] == 13.0
    assert [r["agent_steps"] for r in run.iterations] == [2400, 4800]
    assert run.iterations[1]["episode_return_mean"] == -25.5
    assert peer.PEER_PREFIX == peer_rllib.PREFIX


@pytest.mark.parametrize(("text", "message"), [
    ("dppo-peer {not json", "line 1 is not JSON"),
    ('dppo-peer {"event": "start", "t": 1}\ndppo-peer {"event": "iteration", "t": 2}', "lacks agent_steps"),
    ('dppo-peer {"event": "start", "t": 1}\ndppo-peer {"event": "restart"}', "unknown event 'restart'"),
    ("RLlib only\n", "no start line"),
])
def test_malformed_peer_output_is_named(text: str, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        peer.parse_peer_output(text)


def test_the_spec_mirrors_dppos_config_and_the_peer_defaults_are_the_example() -> None:
    config = with_agents(load_config(EXAMPLE))
    spec = peer.peer_spec(config, str(EXAMPLE))
    assert spec["env"] == config.env.id and spec["env_kwargs"] == config.env.kwargs
    assert spec["runners"] == config.run.actors and spec["columns_per_runner"] == config.columns == 24
    assert spec["agent_steps"] == config.run.total_steps and spec["minibatch_size"] == config.minibatch_size
    assert (spec["learning_rate"], spec["entropy_coef"], spec["activation"]) == (
        config.ppo.learning_rate, config.ppo.entropy_coef, config.model.activation)
    assert spec == json.loads(json.dumps(peer_rllib.Spec().__dict__))  # the script alone runs the example
    assert set(spec) == set(peer_rllib.Spec.__dataclass_fields__)  # every field the script takes, and no other


@pytest.mark.parametrize(("sets", "message"), [
    (["env.global_state=true"], "no counterpart for env.global_state"),
    (["ppo.target_kl=0.02"], "no counterpart for ppo.target_kl"),
    (["model.recurrent=lstm"], "no counterpart for model.recurrent"),
])
def test_a_config_the_peer_cannot_mirror_is_refused(sets: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        peer.peer_spec(load_config(EXAMPLE, sets=sets), "x.yaml")


def test_a_single_agent_config_is_refused() -> None:
    with pytest.raises(UsageError, match="'CartPole-v1' is not a PettingZoo env"):
        peer.peer_spec(load_config(overrides={"env.id": "CartPole-v1"}), "cartpole.yaml")


def test_an_unusable_peer_python_is_one_line_naming_the_venv(tmp_path: Path) -> None:
    spec = peer_rllib.Spec().__dict__
    with pytest.raises(UsageError, match=r"no such interpreter; create the peer's venv: python3 -m venv") as missing:
        peer.check_peer_python(tmp_path / "nope" / "python", spec)
    assert "\n" not in str(missing.value) and "ray[rllib]" in str(missing.value)
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'Traceback (most recent call last):' >&2\n"
                    "echo \"ModuleNotFoundError: No module named 'ray'\" >&2\nexit 1\n")
    os.chmod(fake, 0o755)
    with pytest.raises(UsageError, match=r"cannot run RLlib's PPO on mpe2.simple_spread_v3 \(ModuleNotFoundError: No "
                                         r"module named 'ray'\); create the peer's venv") as broken:
        peer.check_peer_python(fake, spec)
    assert "\n" not in str(broken.value)
    fake.write_text("#!/bin/sh\necho 'all good, but not the peer'\n")  # exits 0 without the versions line
    with pytest.raises(UsageError, match="cannot run RLlib's PPO"):
        peer.check_peer_python(fake, spec)


def test_the_figure_draws_both_systems_one_legend_entry_each(tmp_path: Path) -> None:
    def curve(label: str, offset: float) -> Curve:
        return Curve(label, [offset + 1.0, offset + 2.0], [2400, 4800], [-28.0, -24.0], None, "mpe2.simple_spread_v3")

    path = peer.figure({"dppo": [curve("a", 10.0), curve("b", 11.0)], "RLlib PPO": [curve("c", 30.0)]},
                       tmp_path / "docs" / "fig.png", "title")
    assert path.read_bytes().startswith(b"\x89PNG")


def test_a_system_row_is_mean_and_spread_over_seeds() -> None:
    runs = [{"seed": s, "agent_steps": 4800, "return": r, "wall_s": w, "train_s": w - 10, "startup_s": 10.0}
            for s, r, w in ((1, -20.0, 40.0), (2, -22.0, 44.0))]
    row = peer.system_row("dppo", "0.1.0", runs)
    assert row["agent_steps"] == 4800 and row["seeds"] == 2
    assert row["return"] == f"-21.00 +- {math.sqrt(2):.2f}" and row["wall_s"].startswith("42.0 +- ")
    assert row["per_seed"] == "1: -20.00 in 40s, 2: -22.00 in 44s"
    row = peer.system_row("peer", "x", [runs[0], {**runs[1], "agent_steps": 7200}])
    assert row["agent_steps"] == "4800/7200"  # unequal budgets show, never averaged away


def test_a_budget_without_a_finished_episode_is_bad_input() -> None:
    run = {"seed": 1, "agent_steps": 10, "return": None, "wall_s": 9.0, "train_s": 1.0, "startup_s": 8.0}
    with pytest.raises(UsageError, match="no episode finished within --total-steps"):
        peer.system_row("dppo", "0.1.0", [run])
