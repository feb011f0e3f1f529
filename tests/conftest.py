"""Shared fixtures: one local Ray cluster per session and the external tools (`make tools` installs them)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from parallel import RESOURCE_MODULES, ResourceScheduling, turn, unlisted_users
from prepared import Prepared, first_used, ordered_last

REPO = Path(__file__).resolve().parents[1]
# `run.inference: auto` follows a `dppo tune` result saved for this machine (dppo/config/tuned.py): the tests see none
# but those they save themselves (each in its own directory), whatever this machine's user has tuned.
os.environ["DPPO_TUNE_DIR"] = str(REPO / ".cache" / "tune-results-of-no-one")

# A user's own PettingZoo module (written to crowd.py by the tests that train it): agents that leave early, masks
CROWD = '''
import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv


class Crowd(ParallelEnv):
    """Three agents; agent i leaves (terminated) after 3 + 2i steps; its mask allows buttons i and i + 1 (mod 3), and
    it earns 1 for pressing button i, 0 for the other: what it earns depends on what it learned."""

    metadata = {"name": "crowd_v0"}

    def __init__(self, render_mode=None):
        self.possible_agents = ["a0", "a1", "a2"]
        self.render_mode = render_mode

    def observation_space(self, agent):
        return gym.spaces.Dict({"t": gym.spaces.Box(0, 100, (1,), np.float32),
                                "action_mask": gym.spaces.MultiBinary(3)})

    def action_space(self, agent):
        return gym.spaces.Discrete(3)

    def _obs(self, agent):
        i = self.possible_agents.index(agent)
        mask = np.zeros(3, np.int8)
        mask[[i, (i + 1) % 3]] = 1
        return {"t": np.array([self.t], np.float32), "action_mask": mask}

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        for agent, action in actions.items():
            assert action != (self.possible_agents.index(agent) + 2) % 3, "a masked action was taken"
        rewards = {a: float(actions[a] == self.possible_agents.index(a)) for a in self.agents}
        term = {a: self.t >= 3 + 2 * self.possible_agents.index(a) for a in self.agents}
        obs = {a: self._obs(a) for a in self.agents}
        trunc = {a: False for a in self.agents}
        self.agents = [a for a in self.agents if not term[a]]
        return obs, rewards, term, trunc, {a: {} for a in actions}


def parallel_env(render_mode=None):
    return Crowd(render_mode)
'''


def run_dppo(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m dppo ARGS` as a user runs it, output captured."""
    return subprocess.run([sys.executable, "-m", "dppo", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)


def run_benchmark(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m benchmarks ARGS` as from a clone (the clone's root on the path, whatever ``cwd``), output captured."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


def train_small(ray_address: str, run_dir: Path, *args: str, total_steps: int = 2048) -> subprocess.CompletedProcess:
    """A short seeded CartPole `dppo train` on the session's cluster (2 actors x 4 envs x 64 steps), output captured."""
    return run_dppo("train", "--address", ray_address, "--run-dir", str(run_dir), "--actors", "2", "--envs-per-actor",
                    "4", "--segment-length", "64", "--total-steps", str(total_steps), "--seed", "3", "--set",
                    "run.tensorboard=false", *args, timeout=240)


def progress_records(run: Path) -> list[dict]:
    """A run directory's progress.jsonl, one dict per iteration."""
    return [json.loads(line) for line in (run / "progress.jsonl").read_text().splitlines()]


def without_timings(records: list[dict]) -> list[dict]:
    """The records less their wall-clock keys (``*_s``): what a seeded run must reproduce exactly."""
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in records]
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def load_module(path: Path) -> ModuleType:
    """A Python file that is not part of the package (the dashboard generator beside the chart), as a module."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = sys.modules.get(spec.name)
    if module is None or getattr(module, "__file__", None) != str(path):
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses and pickling look their module up there
        spec.loader.exec_module(module)
    return module


def new_checkpoint(config: Any, obs_stats: Any = None) -> tuple[dict[str, Any], Any]:
    """A checkpoint of a fresh run of ``config`` (its initial weights) as a run writes it, and the model."""
    import torch

    from dppo.envs.make import env_spaces
    from dppo.rl.model import ActorCritic
    from dppo.rl.ppo import Trainer
    from dppo.run.checkpoint import compose
    from dppo.run.state import RunState

    model = ActorCritic(*env_spaces(config), config.model)
    state = RunState(config, model.obs_spec.vector_dim)
    if obs_stats is not None:
        state.obs_stats = obs_stats
    trainer = Trainer(model, config.ppo, config.num_iterations, config.run.seed, torch.device("cpu"))
    name = config.policy_names[0]
    return compose(state, {name: model.state_dict()}, {name: trainer.state_dict()}, None), model


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"  # what `dppo plot` writes starts with


def run_curves(figure) -> list[dict[str, list]]:
    """Per axes of a `dppo plot` figure: label -> x data of the run curves (lines whose label is not hidden
    with '_')."""
    return [{line.get_label(): list(line.get_xdata()) for line in ax.get_lines()
             if not line.get_label().startswith("_")} for ax in figure.axes]


def error_line(stderr: str) -> str:
    """The one line a failed run ends with. Only the progress lines of a slow actor start (one every 10 s while
    actors make their envs, more likely on a busy machine) may come before it."""
    *progress, line = stderr.strip().splitlines()
    assert all(p.startswith("waiting for actors to be placed and start") for p in progress), stderr
    assert "Traceback" not in stderr, stderr
    return line


def processes_with(marker: str) -> list[int]:
    """Pids whose environment holds ``marker`` (a run's processes and every Ray process it started inherit it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def require(condition: bool, reason: str) -> None:
    """Skip when a prerequisite is missing on a user's machine; fail under CI, where it must exist."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{reason} (required under CI=true)")
    pytest.skip(reason)


def _tool(name: str) -> str | None:
    local = REPO / ".tools" / "bin" / name
    return str(local) if local.exists() else shutil.which(name)


@pytest.fixture(scope="session")
def helm_bin() -> str:
    path = _tool("helm")
    require(path is not None, "helm not found; `make tools` installs it (scripts/get-tools)")
    return str(path)


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    path = _tool("prometheus")
    require(path is not None, "prometheus not found; `apt-get install prometheus` (make tools does it as root)")
    return str(path)


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """One local Ray cluster for the whole session; CLI subprocesses join it with --address. Started with Ray's
    test helper, which can leave out the log monitor: no driver here takes the workers' output (log_to_driver is
    off in every one), and the monitor tailing each worker's log files was 2% of the suite's CPU."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 4, "include_dashboard": False, "include_log_monitor": False,
        "object_store_memory": 2 * 1024**3})  # the helper's default, 150 MiB, is less than Atari runs want
    try:
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR", configure_logging=True)
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture
def keep_signal_handlers() -> Iterator[None]:
    """A coordinator run in the test process installs SIGTERM/SIGINT handlers for its run; pytest's own come back
    after the test."""
    import signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.fixture
def dppo_cmd() -> list[str]:
    """The real CLI, run as a subprocess of the venv's interpreter."""
    return [sys.executable, "-m", "dppo"]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI=true a skipped test is a failure: every test must run there (a user's clone included). The
    background resources are taken down first."""
    for resource in PREPARED.values():  # the image's daemon stopped and the image removed
        resource.close()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if IN_CI and skipped and session.exitstatus == 0:
        reporter.write_line(f"CI=true: {len(skipped)} test(s) skipped; every test must run in CI", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def image_maker() -> Callable[[], contextlib.AbstractContextManager[Any]] | None:
    """How the image is built (tests/deploy/image_build.py), or None where it cannot be: the fixture says why."""
    build = load_module(REPO / "tests" / "deploy" / "image_build.py")
    return build.built_image if not build.missing_tools() and os.geteuid() == 0 else None


def peer_venv() -> Path:
    """The RLlib peer's venv under the clone's .cache/ (git-ignored; `make clean` removes it), kept while it works. Its
    python. It is layered on the project's venv (a .pth file adds that venv's site-packages after its own), so pip
    installs only what RLlib adds: the peer's torch and Ray are the project's, the versions PEER_PACKAGES pins, and
    what RLlib pins differently (its gymnasium) is installed in the peer's own site-packages, which come first. A
    user's separate venv (VENV_HINT) installs a second torch and Ray: two minutes of CPU here, for the same code."""
    import sysconfig

    from benchmarks.peer import PEER_PACKAGES, PEER_SCRIPT, PEER_VENV

    venv = REPO / PEER_VENV
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([str(python), str(PEER_SCRIPT), "--check"], capture_output=True,
                                          timeout=300).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    project = sysconfig.get_paths()["purelib"]  # addsitedir, not a bare path: its own .pth files count too
    (Path(own) / "dppo-project-venv.pth").write_text(f"import site; site.addsitedir({project!r})\n")
    for group in PEER_PACKAGES:
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", *group], capture_output=True, text=True,
                              timeout=900)
        assert done.returncode == 0, f"pip install {' '.join(group)}: {done.stderr[-2000:]}"
    return python


PREPARED: dict[str, Prepared] = {}  # fixture name -> its resource, being made in the background


def makers() -> dict[str, Callable[[], contextlib.AbstractContextManager[Any]] | None]:
    """The session fixtures made in the background (tests/prepared.py) and how each is made."""
    return {"docker_image": image_maker(), "peer_python": lambda: contextlib.nullcontext(peer_venv())}


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Alone, the slow resources the selected tests use start being made now and those tests run last. In a worker
    of `pytest -n` their tests run first, on one worker (tests/parallel.py), which makes each resource when its
    first test asks: the other workers' tests overlap it."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        resources = set(RESOURCE_MODULES.values())
        if unlisted := unlisted_users(items, resources):
            raise pytest.UsageError(f"{unlisted[0]} uses a resource its module is not given in tests/parallel.py "
                                    "RESOURCE_MODULES: add the module there")
        items[:] = first_used(items, resources)
        return
    how = makers()
    items[:] = ordered_last(items, set(how))
    if config.option.collectonly:
        return
    for name in sorted({name for item in items for name in item.fixturenames if name in how}):
        if (make := how[name]) is not None:
            PREPARED[name] = Prepared(name, make)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`pytest -n N` (xdist's default `--dist load`): the tests of one built resource on one worker."""
    return ResourceScheduling(config, log) if config.getvalue("dist") == "load" else None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """In a worker of `pytest -n`, a test marked `alone` runs while no other test does (tests/parallel.py). The turn
    wraps pytest-timeout's hook, so waiting for it is not part of a test's timeout; a background resource the test
    uses is waited for first, holding no turn (a test that fails on it reports the error from its fixture)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return (yield)
    for name in sorted(set(RESOURCE_MODULES.values()).intersection(getattr(item, "fixturenames", ()))):
        if name in PREPARED or makers()[name] is not None:
            with contextlib.suppress(Exception):
                prepared(name)
    # xdist gives each worker the basetemp <the session's>/gwN: the parent is the one every worker sees.
    lock = Path(item.config.option.basetemp).parent / "turns.lock"
    with turn(lock, item.get_closest_marker("alone") is not None):
        return (yield)


def prepared(name: str) -> Any:
    """The background resource ``name`` (made now if the session did not start it), once it is made."""
    if name not in PREPARED:
        make = makers()[name]
        assert make is not None, name
        PREPARED[name] = Prepared(name, make)
    return PREPARED[name].result()


@pytest.fixture(scope="session")
def docker_image() -> Any:
    """The real image, built once per session and loaded into a private Docker daemon (tests/deploy/image_build.py):
    the image test and the emulation of the chart's pods as containers share it. Both live under the clone's
    .cache/ (buildah's store, the daemon's data), not in the machine's stores; the session removes what it made.
    The build starts in the background when the session starts (tests/prepared.py)."""
    build = load_module(REPO / "tests" / "deploy" / "image_build.py")
    missing = build.missing_tools()
    require(not missing, f"the image tests need {', '.join(missing)}: apt-get install buildah mmdebstrap "
                         "docker.io (.ci/run does), or run them where they are")
    require(os.geteuid() == 0, "the image tests run buildah (chroot isolation) and dockerd as root")
    return prepared("docker_image")


@pytest.fixture(scope="session")
def peer_python() -> Path:
    """The RLlib peer's venv (see peer_venv), made in the background from the session's start."""
    return prepared("peer_python")
