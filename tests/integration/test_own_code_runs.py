"""A network of one's own and the env's own figures in real runs on the session's cluster: the example network on a
Dict observation through the inference service with two learners, resumed from its checkpoint, evaluated and
exported; and in the actors on an env whose info carries success, which reaches progress.jsonl, TensorBoard and
/metrics."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from runs import progress_records, wait_until
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from dppo.distributed.ports import free_ports

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = "examples.own_network.nets:ResidualMLP"


def dppo(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """`python -m dppo` from the repository's root, where the example network's module is importable."""
    return subprocess.run([sys.executable, "-m", "dppo", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)


@pytest.mark.slow
def test_own_network_on_a_dict_observation_in_the_service_with_two_learners_resumes_evaluates_exports(
        tmp_path: Path, ray_address: str) -> None:
    run_dir = tmp_path / "run"
    base = ["train", "--address", ray_address, "--run-dir", str(run_dir), "--env", "dppo/DictMatch-v0",
            "--actors", "1", "--envs-per-actor", "4", "--segment-length", "32", "--seed", "2",
            "--set", f"model.entry_point={EXAMPLE}", "--set", "ppo.minibatch_size=64", "--set",
            "run.tensorboard=false", "--set", "run.target_return=null"]
    first = dppo(*base, "--total-steps", "256", "--set", "run.inference=server", "--set", "run.learners=2")
    assert first.returncode == 0, first.stderr
    said = first.stdout + first.stderr
    assert "inference in one inference service" in said and "2 learners" in said, said
    resumed = dppo(*base, "--resume", "--total-steps", "512", "--set", "run.inference=actor")  # in the actors now
    assert resumed.returncode == 0, resumed.stderr
    records = progress_records(run_dir)
    assert [r["env_steps"] for r in records] == [128, 256, 384, 512]  # two iterations on, from the checkpoint
    assert json.loads((run_dir / "summary.json").read_text())["env_steps"] == 512
    checkpoint = run_dir / "checkpoints"
    evaluated = dppo("eval", "--checkpoint", str(checkpoint), "--episodes", "2")
    assert evaluated.returncode == 0 and "return" in evaluated.stdout, evaluated.stderr
    exported = dppo("export", "--checkpoint", str(run_dir), "-o", str(tmp_path / "policy.onnx"))
    assert exported.returncode == 0, exported.stderr
    import onnxruntime

    session = onnxruntime.InferenceSession(str(tmp_path / "policy.onnx"))
    image = np.zeros((3, 36, 36, 1), np.uint8)
    (action,) = session.run(None, {"obs.image": image, "obs.flip": np.array([0, 1, 0])})
    assert action.shape == (3,) and set(action.tolist()) <= {0, 1, 2, 3}
    # the checkpoint names the network: without its module, eval says so in one line
    elsewhere = subprocess.run([sys.executable, "-m", "dppo", "eval", "--checkpoint", str(checkpoint)],
                               capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert elsewhere.returncode == 2 and elsewhere.stderr.count("\n") == 1, elsewhere.stderr
    assert "cannot import module 'examples.own_network.nets' for model.entry_point" in elsewhere.stderr


@pytest.mark.slow
def test_the_env_info_success_reaches_progress_tensorboard_and_metrics(tmp_path: Path, ray_address: str) -> None:
    """The example network in the actors; the env's info success and distance of the episodes that ended."""
    run_dir, (port,) = tmp_path / "run", free_ports(1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dppo", "train", "--address", ray_address, "--run-dir", str(run_dir),
         "--env", "dppo/InfoCartPole-v0", "--actors", "1", "--envs-per-actor", "4", "--segment-length", "64",
         "--total-steps", "768", "--metrics-port", str(port), "--set", "metrics.host=127.0.0.1",
         "--set", "metrics.linger_s=120", "--set", "metrics.info_keys=[success, distance, never]",
         "--set", f"model.entry_point={EXAMPLE}", "--set", "ppo.minibatch_size=64"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        # the run is over; its metrics linger to be scraped
        wait_until(lambda: (run_dir / "summary.json").exists(), proc, "the run's end (summary.json)", timeout=200)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            body = resp.read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    records = progress_records(run_dir)
    assert len(records) == 3
    for record in records:  # an untrained CartPole ends several episodes per 256 steps, each with its distance
        assert 0 <= record["info/success"] <= 1 and record["info/distance"] >= 0
        assert record["info/never"] is None  # no episode set it: no value, not 0
    last = records[-1]
    assert f'dppo_env_info{{key="success"}} {last["info/success"]!r}' in body, body
    assert 'key="never"' not in body
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    points = acc.Scalars("info/success")
    assert [p.step for p in points] == [r["env_steps"] for r in records]
    assert np.allclose([p.value for p in points], [r["info/success"] for r in records])
    assert "info/never" not in acc.Tags()["scalars"]
