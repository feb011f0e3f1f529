"""`python -m benchmarks learning-checks`: the seeded learning runs the test suite used to hold, each with the
threshold its test asserted (issue 45 item 7: learning runs are benchmarks, not tests).

Each check is one `dppo train` exactly as its test ran it (env, seed, budget, overrides), then the measure its test
read: the final 100-episode training return, the last iteration's return, `dppo eval`'s mean, or the critic's
explained variance. The tests keep a fast pipeline-only form of each run; what a policy learns is checked here.
Exit 1 when a check misses its threshold (its name on stderr), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import operator
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.learn import evaluate_run
from dppo.bench.common import Row, add_common_args, machine
from dppo.bench.docs import emit
from dppo.bench.runs import run_train
from dppo.cli_args import positive
from dppo.errors import UsageError

REPO = Path(__file__).resolve().parents[1]
DOCS_PAGES = ("README.md", "docs/environments.md", "docs/sweeps.md")  # where the user docs' `dppo` lines are
COMPARE: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, ">": operator.gt, "==": operator.eq,
                                                      "<=": operator.le}
# the fast settings of tests/integration/test_custom_env.py (FAST there)
FAST = ("--envs-per-actor", "4", "--segment-length", "32", "--set", "ppo.minibatch_size=64",
        "--set", "ppo.learning_rate=0.003", "--set", "ppo.gamma=0.9")
CUE = ("--env", "dppo/CueCorridor-v0", "--actors", "2", "--envs-per-actor", "8", "--segment-length", "32",
       "--seed", "1", "--no-tensorboard", "--set", "ppo.minibatch_size=128", "--set", "ppo.learning_rate=0.001",
       "--total-steps", "16384")
SPACES = ("--actors", "2", "--total-steps", "30000", "--target-return", "9.5", "--seed", "1", "--envs-per-actor", "4",
          "--segment-length", "32", "--set", "ppo.minibatch_size=64", "--set", "ppo.learning_rate=0.002",
          "--set", "ppo.gamma=0.5")


@dataclass(frozen=True)
class Check:
    """One seeded `dppo train` and the threshold its test asserted on it."""

    name: str
    argv: tuple[str, ...]  # `dppo train` arguments (a `docs:MARKER` first item: the docs' command mentioning MARKER)
    measure: str  # "train_return" (summary), "last_return" (last iteration), "eval", "explained_variance"
    op: str  # one of COMPARE
    threshold: float
    solved: bool = False  # the run must also stop at its target return
    eval_episodes: int = 0  # for measure "eval": `dppo eval --episodes N` (its default seed, as the test ran it)
    was: str = ""  # the test that ran it


CHECKS = (
    Check("frozenlake-non-slippery", ("--env", "FrozenLake-v1", "--set", "env.kwargs.is_slippery=false", "--actors",
                                      "2", "--total-steps", "30000", "--target-return", "0.95", "--seed", "1", *FAST),
          "eval", "==", 1.0, solved=True, eval_episodes=5,
          was="test_custom_env.py::test_frozenlake_non_slippery_learns_the_optimal_return"),
    Check("blackjack", ("--env", "Blackjack-v1", "--actors", "2", "--envs-per-actor", "8", "--segment-length", "64",
                        "--total-steps", "60000", "--seed", "1", "--set", "ppo.gamma=1.0", "--set",
                        "ppo.learning_rate=0.001"),
          "eval", ">", -0.15, eval_episodes=2000,
          was="test_custom_env.py::test_blackjack_trains_to_near_optimal_play (basic strategy: about -0.05; "
              "random: -0.4)"),
    *(Check(f"spaces-{env_id.split('/')[1].split('-')[0]}", ("--env", env_id, *SPACES), "eval", ">=", 9.5,
            solved=True, eval_episodes=5,
            was=f"test_custom_env.py::test_multibinary_multidiscrete_and_dict_spaces_learn[{env_id}]")
      for env_id in ("dppo/MatchBits-v0", "dppo/MatchDigits-v0", "dppo/DictMatch-v0")),
    Check("minigrid-example", ("docs:examples/minigrid.yaml", "--no-tensorboard"), "train_return", ">=", 0.95,
          solved=True, was="test_readme_examples.py::test_the_minigrid_example_trains_to_the_optimum_as_written"),
    Check("lstm-example", ("docs:examples/cue-corridor-lstm.yaml", "--no-tensorboard"), "train_return", ">=", 0.95,
          solved=True, was="test_readme_examples.py::test_the_lstm_example_is_the_file_and_solves_its_memory_task"),
    Check("cue-corridor-lstm", (*CUE, "--set", "model.recurrent=lstm", "--set", "model.lstm_hidden_size=32"),
          "last_return", ">=", 0.9,
          was="test_recurrent_runs.py::test_an_lstm_solves_the_cue_corridor_and_a_feed_forward_policy_does_not"),
    Check("cue-corridor-feed-forward", CUE, "last_return", "<=", 0.5,
          was="the same test: a feed-forward policy cannot beat a coin flip (0)"),
    Check("cartpole-value-normalization", ("--env", "CartPole-v1", "--actors", "1", "--total-steps", "6144",
                                           "--set", "ppo.normalize_value=true", "--set", "ppo.num_minibatches=2",
                                           "--set", "run.target_return=null"),
          "explained_variance", ">", 0.5,
          was="test_value_normalization.py::test_a_short_cartpole_run_with_value_normalization_learns (there in one "
              "process, 12 iterations of 512 steps; the best of the last 4 iterations)"),
    Check("cartpole-two-actors", ("--actors", "2", "--seed", "1", "--total-steps", "300000"), "eval", ">=", 200,
          solved=True, eval_episodes=3,
          was="test_training_runs.py::test_cartpole_two_actors_solves_within_budget (also: return >= 475 at the stop)"),
)
BY_NAME = {check.name: check for check in CHECKS}


def docs_command(marker: str) -> list[str]:
    """The `dppo ...` line of a user docs' shell block that mentions ``marker``, as argv less `dppo train` (what
    tests/integration/test_readme_examples.py runs as written)."""
    text = "\n".join((REPO / page).read_text() for page in DOCS_PAGES)
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            if line.startswith("dppo train ") and marker in line:
                return shlex.split(line.split("#")[0])[2:]
    raise UsageError(f"no `dppo train` command mentioning {marker!r} in {', '.join(DOCS_PAGES)}")


def train_argv(check: Check) -> list[str]:
    """The check's `dppo train` arguments; a docs command's file paths made absolute (they are the clone's)."""
    head, *rest = check.argv
    if not head.startswith("docs:"):
        return list(check.argv)
    return [str(REPO / arg) if (REPO / arg).is_file() else arg for arg in docs_command(head[5:])] + rest


def measure(check: Check, run_dir: Path, timeout_s: float) -> float:
    records = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    if check.measure == "eval":
        return evaluate_run(run_dir, check.eval_episodes, timeout_s, seed=None)  # as the tests ran it
    if check.measure == "last_return":
        return records[-1]["episode_return_mean"]
    if check.measure == "explained_variance":
        return max(r["explained_variance"] for r in records[-4:])
    return json.loads((run_dir / "summary.json").read_text())["episode_return_mean"]


def run_check(check: Check, run_dir: Path, timeout_s: float, total_steps: int | None = None,
              address: str | None = None) -> Row:
    """One check: its `dppo train`, then its measure; a run that fails is a failed check, with its error."""
    argv = [*train_argv(check), *(["--total-steps", str(total_steps)] if total_steps else []),
            *(["--address", address] if address else [])]
    threshold = f"{check.op} {check.threshold:g}" + (", solved" if check.solved else "")
    what = check.measure + (f" ({check.eval_episodes} episodes)" if check.eval_episodes else "")
    row: Row = {"check": check.name, "measure": what, "threshold": threshold, "value": None, "solved": None,
                "env_steps": None, "wall_s": None, "passed": False, "was": check.was, "run_dir": str(run_dir)}
    try:
        run = run_train(argv, run_dir, timeout_s)
        value = measure(check, run_dir, timeout_s)
    except (RuntimeError, FileNotFoundError) as err:
        row["error"] = str(err).splitlines()[-1]
        return row
    passed = COMPARE[check.op](value, check.threshold) and (run["solved"] or not check.solved)
    return {**row, "value": round(value, 4), "solved": run["solved"], "env_steps": run["env_steps"],
            "wall_s": run["wall_s"], "passed": passed}


def select(only: str | None) -> list[Check]:
    """The checks ``--only`` names (comma-separated), all by default; an unknown name is bad input."""
    if only is None:
        return list(CHECKS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown or not names:
        raise UsageError(f"--only: unknown check {', '.join(map(repr, unknown)) or '(none given)'}; "
                         f"the checks are {', '.join(BY_NAME)}")
    return [BY_NAME[n] for n in dict.fromkeys(names)]


def register(sub: argparse._SubParsersAction) -> None:
    """Add `python -m benchmarks learning-checks`."""
    parser = sub.add_parser("learning-checks", help="the seeded learning runs the tests used to hold, each against "
                            "the threshold its test asserted (exit 1 if one misses)")
    parser.add_argument("--only", metavar="NAMES", help=f"comma-separated checks (default all: {', '.join(BY_NAME)})")
    parser.add_argument("--total-steps", type=positive(int, "--total-steps"),
                        help="every check's budget (default: each its own; a smaller one tests the pipeline, and "
                             "checks are expected to fail)")
    parser.add_argument("--out-dir", type=Path, help="where the runs go (default runs/bench-learning-checks-<time>)")
    parser.add_argument("--timeout", type=positive(float, "--timeout"), default=1200.0, help="seconds per run")
    add_common_args(parser)
    parser.set_defaults(func=cmd_learning_checks)


def cmd_learning_checks(args: argparse.Namespace) -> int:
    checks = select(args.only)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out_dir = (args.out_dir or Path("runs") / f"bench-learning-checks-{stamp}").resolve()
    info = machine()
    rows = []
    for check in checks:  # one at a time: each is a whole run on the machine's cores
        row = run_check(check, out_dir / check.name, args.timeout, args.total_steps, args.address)
        print(f"{row['check']}: {row['measure']} {row['value']} (threshold {row['threshold']}): "
              f"{'pass' if row['passed'] else 'FAIL'}, {row['wall_s']} s" + (f"; {row['error']}" if "error" in row
                                                                                else ""), flush=True)
        rows.append(row)
    for row in rows:
        row["result"] = "pass" if row["passed"] else "FAIL"
    failed = [row["check"] for row in rows if not row["passed"]]
    budget = f" Every budget capped at --total-steps {args.total_steps}." if args.total_steps else ""
    note = ("The seeded learning runs the test suite held until issue 45 (learning runs are benchmarks, not tests), "
            "each exactly as its test ran it, against the threshold its test asserted; the tests keep a fast "
            "pipeline-only form of each. `value`: the measure (`train_return`: the run's final 100-episode return; "
            "`last_return`: its last iteration's; `eval`: `dppo eval` of the final policy, eval's default seed; "
            "`explained_variance`: the best of the last 4 iterations'); `solved`: the run stopped at its target "
            f"return. `wall_s`: launch to exit of `dppo train`. Exit 1 when a check fails.{budget}")
    columns = ["check", "measure", "value", "threshold", "solved", "env_steps", "wall_s", "result"]
    emit(args, rows, columns, args.section or "learning-checks", "Learning checks: the runs the tests used to hold",
         note, info)
    if failed:
        print(f"learning checks failed: {', '.join(failed)}", file=sys.stderr, flush=True)
        return 1
    return 0
