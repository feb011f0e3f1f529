"""The ``run``, ``metrics`` and ``faults`` sections: how a run is driven, observed and kept alive."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from dppo.config.base import Section


class RunConfig(Section):
    actors: int = Field(2, ge=1, le=1024)
    """N: Ray actors collecting segments in parallel."""
    total_steps: int = Field(200_000, ge=1)
    """Stop after this many env steps (all actors together)."""
    target_return: float | None = None
    """Stop when the mean return of the last 100 finished episodes reaches this (off when null)."""
    time_limit_s: float | None = Field(None, gt=0)
    """Stop (with a checkpoint) after this many seconds of training, counted over the whole run: a resumed
    run's earlier training counts, so one budget spans every resume; a run resumed with its budget spent says
    so and ends at once (exit 0): raise the limit to go on. A wall-clock budget, for comparing actor counts at
    equal time or fitting a run into a job's deadline (off when null)."""
    seed: int = Field(1, ge=0)
    """Seed for torch, numpy and every env; a seeded run is reproducible on the same machine."""
    run_dir: str | None = None
    """Where progress, summary and checkpoints go (default runs/<env>-<timestamp>)."""
    name: str | None = None
    """Run name shown in logs and in the dppo_run_info metric's run label (default: the run dir's name)."""
    checkpoint_every: int = Field(10, ge=1)
    """Write a checkpoint every this many iterations (and always at the end)."""
    keep_checkpoints: int = Field(3, ge=1)
    """How many of the newest checkpoints to keep."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the learners train: auto picks cuda when available."""
    inference: Literal["actor", "server", "auto"] = "auto"
    """Where the policy's forward pass runs while sampling. actor: in each actor's process (numpy for MLPs, torch on
    its CPU for CNN and LSTM). server: one inference service beside the learner on run.device batches every
    actor's observations into one forward pass (each actor steps its envs in two halves, one while the other's
    actions are computed, so env.num_envs must be even or 1); actors on the service's node reach it through
    shared memory, others by Ray calls; actors still draw their actions with their own seeded streams. auto: the
    one `dppo tune` measured fastest for this env on this machine (its saved result; the ready line names it),
    else actor, the mode no measurement has found slower everywhere (issue 42)."""
    learners: int = Field(1, ge=1, le=64)
    """L: data-parallel learner processes (torch.distributed through Ray). 1: the update runs in the driver.
    With L > 1 each global minibatch is split evenly, so ppo.minibatch_size must be a multiple of L."""
    learner_cpus: float = Field(1.0, gt=0)
    """Ray CPUs reserved per learner process (run.learners > 1)."""
    learner_resource: str | None = None
    """A custom Ray resource each learner process asks one unit of (run.learners > 1), so learners land on the
    nodes that advertise it and nowhere else; the learners then reserve no Ray CPUs (the Helm chart's
    `learners:` pods advertise `dppo_learner` with num-cpus 0, so actors never land there)."""
    actor_cpus: float = Field(1.0, gt=0)
    """Ray CPUs reserved per actor (formerly run.actor_num_cpus); also the threads of ale-py's vector env."""
    actor_threads: int = Field(1, ge=1)
    """torch threads in each actor, for image policies (formerly run.torch_threads; one is fastest for small
    batches)."""
    actor_gpus: float = Field(0.0, ge=0)
    """GPUs each actor asks Ray for (a share: 0.25 places four actors on one GPU; above 1 a whole number, Ray's
    rule); an actor given one runs its own policy there (cuda) with run.inference=actor. With many envs
    (env.num_envs) in ale-py's vector env (run.actor_cpus threads) and run.actor_halves=2 this is EnvPool's pattern
    in one actor. 0: the actors' policy runs on their CPU."""
    actor_halves: Literal[1, 2] = 1
    """How each actor steps its envs with its own policy (run.inference=actor). 2: in two halves of env.num_envs/2
    (so it must be even), one half stepping while the other's forward pass runs on a worker thread (on the actor's
    GPU share with run.actor_gpus); actions are still drawn with the actor's seeded stream, so a greedy policy acts
    as with 1. 1: every env steps, then the policy acts on all of them."""
    learner_threads: int = Field(1, ge=1)
    """torch CPU threads of each learner's update: 1 is fastest for small MLPs and keeps a shared machine
    from thrashing; raise it for large networks on a CPU learner."""
    overlap_sampling: bool = False
    """Start the next sampling round before the update, with the weights it is about to replace: actors
    run one policy version behind (as in Cleanba) and sampling hides behind the update."""
    runtime_env: dict[str, Any] | None = None
    """Ray runtime_env for the job (working_dir, py_modules, pip, env_vars): how a user's env code reaches
    the workers of a cluster; passed to ray.init."""
    address: str | None = None
    """Ray cluster to join; null starts a local Ray in-process (RAY_ADDRESS is honoured too)."""
    log_format: Literal["text", "json", "none"] = "text"
    """Per-iteration log lines on stdout: human-readable text, one JSON object per line, or none (the lines then
    go to <run_dir>/train.log only; a sweep's trials use it, the sweep logging one line per trial event)."""
    tensorboard: bool = True
    """Write TensorBoard event files to <run_dir>/tensorboard/ (every progress.jsonl scalar, env steps on x)."""
    eval_every: int = Field(0, ge=0)
    """Evaluate the current weights every this many iterations on an evaluation actor of its own, without
    holding up training (0: off): the return goes to progress.jsonl (eval_return_mean ...), TensorBoard,
    Prometheus and summary.json, and the best evaluated weights to checkpoints/best.pt."""
    eval_episodes: int = Field(10, ge=1)
    """Episodes per evaluation."""
    eval_mode: Literal["greedy", "sampled"] = "greedy"
    """greedy: the policy's mode, as `dppo eval`; sampled: actions drawn as in training."""
    eval_cpus: float = Field(0.0, ge=0)
    """Ray CPUs the evaluation actor reserves (0: it fits anywhere, sharing the cores with the rest)."""
    target_on: Literal["training", "evaluation"] = "training"
    """What target_return is judged on: the last 100 training episodes, or the last evaluation's mean return
    (needs eval_every)."""
    callbacks: list[str] = Field(default_factory=list)
    """module.path:function items, called in the driver after each iteration with its figures (one
    dppo.IterationInfo: the progress record, the run dir, the checkpoint written). One that raises dppo.StopRun(reason)
    (or returns False) ends the run after that iteration with a final checkpoint, exit 0 and its reason in
    summary.json; one that raises anything else fails the run (exit 1) after a checkpoint. The module must be
    importable in the driver (docs/python-api.md)."""

    @field_validator("callbacks", mode="before")
    @classmethod
    def _callback_format(cls, value: Any) -> Any:
        value = [value] if isinstance(value, str) else value  # --set run.callbacks=mod:fn names one
        for ref in value if isinstance(value, list) else []:
            if not isinstance(ref, str):
                continue  # pydantic names it
            module, sep, name = ref.partition(":")
            if not sep or not module.strip() or not name.strip() or ":" in name:
                raise ValueError(f"{ref!r} is not module.path:function; write e.g. mypackage.callbacks:stop_early")
        return value


class MetricsConfig(Section):
    port: int = Field(0, ge=0, le=65535)
    """Prometheus metrics port of the run's driver (the process `dppo train` runs in; 0: off)."""
    host: str = "0.0.0.0"
    """Address the metrics server binds to."""
    linger_s: float = Field(0.0, ge=0)
    """Keep serving metrics this long after training ends so the final values get scraped."""
    info_keys: list[str] = Field(default_factory=list)
    """Entries of the env's info to report, e.g. [success, distance]: each iteration, a key's mean over the episodes
    that ended in it (the value in each episode's final step's info, as Stable-Baselines3's Monitor info_keywords) goes
    to progress.jsonl (info/KEY), TensorBoard, Prometheus (dppo_env_info{key=...}) and the dashboard; an iteration
    where no ended episode carried the key has no value. Values must be numbers or booleans."""

    @field_validator("info_keys")
    @classmethod
    def _plain_keys(cls, keys: list[str]) -> list[str]:
        for key in keys:
            if not key.strip() or "/" in key:
                raise ValueError(f"{key!r} is not an info key; name the env's info entries, e.g. [success, distance]")
        if len(set(keys)) != len(keys):
            raise ValueError(f"{keys} names a key twice; name each once")
        return keys


class FaultConfig(Section):
    max_actor_restarts: int = Field(10, ge=0)
    """Actor process crashes allowed within restart_window_s before the run stops (crash-loop guard); actors lost
    with their node (preemption, drain, a node that went away) do not count."""
    min_actors: int = Field(1, ge=1)
    """Elastic floor: rounds go on with the actors that are alive while lost ones wait for room to be replaced;
    below this many alive actors the run waits (and says so) until replacements are placed, and a round that
    losses left below this many segments is topped up by the replacements."""
    actor_start_timeout_s: float = Field(60.0, ge=0)
    """At start, how long to wait for every actor to be placed and ready; after that the run starts with those
    that are (at least min_actors), says so in one line, and the others join as soon as they are ready."""
    actor_wait_timeout_s: float | None = Field(1800.0, gt=0)
    """How long the run waits below min_actors alive actors (at start, or for replacements mid-run) before it ends
    with one line saying what it waited for (actors the cluster has no room for, or ones still making their envs),
    after a checkpoint once training has started; `dppo train --auto-resume` and the chart's retry start it again.
    null: wait as long as it takes (a cluster whose nodes may take hours to come back)."""
    restart_window_s: float = Field(600.0, gt=0)
    """Sliding window for max_actor_restarts, max_learner_restarts and max_hang_restarts."""
    max_learner_restarts: int = Field(3, ge=0)
    """Learner-group restarts (run.learners > 1) allowed within restart_window_s before the run stops."""
    env_retries: int = Field(3, ge=0)
    """An env copy whose reset raises is recreated and reset again up to this many times (then the run stops); a
    vector env that cannot recreate one copy alone (ale-py's) is made afresh mid-segment, its episodes cut, up to
    this many steps in a row."""
    max_env_failure_share: float = Field(0.5, gt=0, le=1)
    """An env copy whose step raises is recreated and its episode cut there (counted, warned, never a return); the
    run stops once such failures are more than this share of the episodes ended so far (failed and finished, after
    at least 10 failures). Episodes much longer than the steps between failures fail often: raise it for those."""
    hang_timeout_s: float | None = Field(None, gt=0)
    """How long the driver waits for any call (an actor's segment, the learners' update, an evaluation, the
    inference service's answer) before it declares the process hung, kills it and replaces it as a crashed one
    (counted as hangs). null: derived from the run's own timings of that call, max(60 s, 10x their median so far);
    set it to catch hangs sooner (a few seconds above a round's usual length), never below a call's real length."""
    max_hang_restarts: int = Field(10, ge=0)
    """Hung processes (see hang_timeout_s) replaced within restart_window_s before the run stops: a process that
    hangs again and again is a fault no replacement mends. Hangs do not spend the crash budgets."""
    sample_timeout_s: float | None = Field(None, gt=0)
    """Per-iteration deadline for segments; late ones are dropped and counted (off when null)."""
    min_actors_fraction: float = Field(1.0, gt=0, le=1)
    """With sample_timeout_s, train on what arrived once at least this fraction of the actors asked (and at least
    min_actors) delivered."""
    nonfinite_data: Literal["error", "drop"] = "error"
    """NaN/Inf in observations or rewards: stop the run with an error, or drop the segment and count it."""
    max_nonfinite_updates: int = Field(3, ge=1)
    """Consecutive updates with a NaN/Inf loss or gradient (each skipped) before the run stops."""
