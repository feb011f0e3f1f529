"""`dppo tune`'s options and how it spends its time budget (dppo/tune/grid.py, search.py), without Ray: the
candidates a config and a cluster allow, each a config `dppo train` accepts, and the budget's two rounds (screens,
then the finalists trained) with measurements that report what the test tells them to, on a clock the test moves."""

from __future__ import annotations

import pytest

from dppo.config import load_config
from dppo.tune.grid import Candidate, actor_counts, distance, grid, minibatches_per_epoch, placement_of
from dppo.tune.measure import Screened, Trained, measurement_config
from dppo.tune.search import predict, search


def test_the_grid_varies_each_option_around_the_config_and_lists_its_own_setting_first() -> None:
    config = load_config(overrides={"env.id": "CartPole-v1"})
    candidates = grid(config, cpus=2, gpus=0, change_batch=True)
    own = Candidate(config.run.actors, config.env.num_envs, config.ppo.segment_length, "actor")
    assert candidates[0] == own
    assert {c.actors for c in candidates} == {1, 2}
    assert {c.envs_per_actor for c in candidates} == {config.env.num_envs // 2, config.env.num_envs,
                                                     config.env.num_envs * 2}
    assert {c.placement for c in candidates} == {"actor", "halves", "server"}  # no GPU: no share
    assert len(candidates) == len(set(candidates)) == 2 * 3 * 3
    neighbours = [sum(getattr(c, f) != getattr(own, f) for f in ("actors", "envs_per_actor", "placement"))
                  for c in candidates]
    assert neighbours == sorted(neighbours)  # a budget that ends early has measured the nearest


def test_a_gpu_adds_the_share_placements_and_a_policy_map_keeps_its_policies_in_the_actors() -> None:
    config = load_config(overrides={"env.id": "CartPole-v1"})
    shares = {c.actors: c.actor_gpus for c in grid(config, cpus=16, gpus=1, places=["gpu"])}
    assert shares == {1: 1.0, 2: 0.5, 4: 0.25, 8: 0.12, 16: 0.06}
    assert actor_counts(16, 2, 2) == [1, 2, 4, 8]
    odd = grid(config, cpus=2, gpus=0, envs=[3], change_batch=True)
    assert {c.placement for c in odd} == {"actor"}  # halves and the service need an even number of envs
    mapped = load_config(overrides={"env.id": "mpe2.simple_speaker_listener_v4", "env.multiagent": True,
                                    "policies": {"speaker": ["speaker*"], "listener": ["listener*"]}})
    assert {c.placement for c in grid(mapped, cpus=2, gpus=1)} == {"actor"}


@pytest.mark.parametrize("preset", ["cartpole", "breakout", "tictactoe"])
def test_every_candidate_is_a_config_dppo_train_accepts_with_the_config_s_minibatches(preset: str) -> None:
    from dppo.config.load import PRESETS_DIR

    path = PRESETS_DIR / f"{preset}.yaml"
    config = load_config(path)
    minibatches = minibatches_per_epoch(config)
    for candidate in grid(config, cpus=4, gpus=1):
        tuned = load_config(path, sets=candidate.sets(minibatches))
        assert (tuned.run.actors, tuned.env.num_envs, placement_of(tuned)) == (
            candidate.actors, candidate.envs_per_actor, candidate.placement)
        assert tuned.batch_size == candidate.batch
        assert tuned.batch_size // tuned.minibatch_size == minibatches  # the update's plan kept


def test_a_measurement_trains_without_a_target_sink_or_checkpoint_for_its_iterations() -> None:
    config = load_config(overrides={"env.id": "CartPole-v1", "run.target_return": 400, "run.eval_every": 5,
                                    "run.time_limit_s": 60})
    counted = measurement_config(config, 2, "/tmp/x")
    assert counted.run.total_steps == 3 * config.batch_size and counted.run.time_limit_s is None
    assert counted.run.target_return is None and counted.run.eval_every == 0 and not counted.run.tensorboard
    assert measurement_config(config, None, "/tmp/x").run.total_steps > 10**15  # until the measurement stops it
    assert config.run.target_return == 400 and config.run.time_limit_s == 60  # the config itself untouched


class Clock:
    """Time the fake measurements spend."""

    def __init__(self) -> None:
        self.now = 0.0


def which(candidates: list[Candidate], cfg) -> Candidate:
    """The candidate a config is."""
    return next(c for c in candidates if (c.actors, c.envs_per_actor, c.placement) ==
                (cfg.run.actors, cfg.env.num_envs, placement_of(cfg)))


def test_the_budget_screens_nearest_the_fastest_predicted_then_trains_the_fastest_few() -> None:
    config = load_config(overrides={"env.id": "CartPole-v1"})
    candidates = grid(config, cpus=2, gpus=0, change_batch=True)
    # Sampling is fastest far from the config's setting (one actor, halves); an update costs 1 ms a step.
    round_s = {c: c.batch * (1e-3 if (c.actors, c.placement) == (1, "halves") else 4e-3) for c in candidates}
    clock, screens, looks = Clock(), [], []

    def first_look(cfg, rounds, updates):
        chosen = which(candidates, cfg)
        screens.append((chosen, updates))
        clock.now += 6.0
        return Screened(chosen.batch, [round_s[chosen]] * rounds, chosen.batch * 1e-3 if updates else None, 4.0,
                        rss_mib=9000.0 if chosen.placement == "server" else 300.0, wall_s=6.0)

    def look(cfg, iterations, seconds):
        chosen = which(candidates, cfg)
        looks.append((chosen, iterations, seconds))
        clock.now += seconds + 5.0
        speed = chosen.batch / (round_s[chosen] + chosen.batch * 1e-3)
        return Trained(5, int(speed * seconds), seconds, wall_s=seconds + 5.0)

    def configure(candidate: Candidate):
        return load_config(overrides={"env.id": "CartPole-v1"}, sets=candidate.sets(minibatches_per_epoch(config)))

    results = search(configure, candidates, budget_s=100, finalists=2, max_rss_mib=1000.0, say=lambda _: None,
                     clock=lambda: clock.now, look=look, first_look=first_look)
    screened = [c for c, _ in screens]
    assert screened[0] == candidates[0] and 5 <= len(screened) < len(candidates)  # the budget's first share
    assert all(distance(c, screened[0]) == 1 for c in screened[1:5])  # the config's neighbours next
    fastest = [c for c in screened if (c.actors, c.placement) == (1, "halves")]
    assert fastest, "the search went where the speed is"
    after = screened[screened.index(fastest[0]) + 1:]
    assert all(distance(c, fastest[0]) <= 1 for c in after[:2])  # then it looks around the fastest
    # An update is timed once per batch size, the first of all twice (the first warms up).
    assert screens[0][1] == 2
    batches = [c.batch for c, updates in screens if updates]
    assert len(batches) == len(set(batches)) == len({c.batch for c in screened})
    assert sum(r.skipped is not None and r.skipped.startswith("not measured") for r in results) == \
        len(candidates) - len(screened)
    trained = [c for c, iterations, _ in looks]
    fits_ = [c for c in screened if c.placement != "server"]
    assert trained == sorted(fits_, key=lambda c: round_s[c] / c.batch)[:2]  # the fastest predicted that fit
    assert all(iterations is None and seconds > 0 for _, iterations, seconds in looks) and clock.now <= 100 + 6
    assert [r.status for r in results[:2]] == ["finalist", "finalist"] and results[2].status == "screened"
    assert results[0].steps_per_s >= results[1].steps_per_s > 0
    assert any(r.skipped and r.skipped.startswith("over --max-rss-mib 1000") for r in results)  # the service rows


def test_a_screen_predicts_with_its_batch_s_update_or_the_nearest_scaled() -> None:
    screened = Screened(1024, [1.0, 3.0], start_s=1.0)
    assert predict(screened, {1024: 2.0}) == pytest.approx(1024 / (2.0 + 2.0))
    assert predict(screened, {512: 1.0, 4096: 1.0}) == pytest.approx(1024 / (2.0 + 2.0))  # 512's, doubled
    assert predict(screened, {}) == 0.0 and predict(Screened(error="no"), {1024: 1.0}) == 0.0


def test_full_grid_trains_every_candidate_the_same_time() -> None:
    config = load_config(overrides={"env.id": "CartPole-v1"})
    candidates = grid(config, cpus=2, gpus=0, actors=[1], envs=[4], change_batch=True)
    seen = []

    def look(cfg, iterations, seconds):
        seen.append((iterations, seconds))
        return Trained(3, 300, 1.0, wall_s=5.0) if cfg.run.actor_halves == 1 else Trained(error="it broke")

    plan = minibatches_per_epoch(config)
    results = search(lambda c: load_config(overrides={"env.id": "CartPole-v1"}, sets=c.sets(plan)), candidates,
                     budget_s=1, say=lambda _: None, full_seconds=30.0, look=look)
    assert seen == [(None, 30.0)] * len(candidates)
    assert [r.status for r in results] == ["measured", "measured", "failed: it broke"]
    seen.clear()  # passes: every candidate again, in turn, its looks added up
    results = search(lambda c: load_config(overrides={"env.id": "CartPole-v1"}, sets=c.sets(plan)), candidates,
                     budget_s=1, say=lambda _: None, full_seconds=30.0, look=look, passes=2)
    assert len(seen) == 2 * len(candidates) and [r.trained.iterations for r in results[:2]] == [6, 6]


def test_a_setting_over_the_gpu_memory_limit_is_left_out() -> None:
    """On a GPU machine a setting whose processes held more GPU memory than --max-gpu-mib is screened but never
    trained or the answer (a CPU measurement, gpu_mib None, is never over it)."""
    config = load_config(overrides={"env.id": "CartPole-v1"})
    candidates = grid(config, cpus=2, gpus=1, actors=[2], envs=[config.env.num_envs], places=["actor", "gpu"])
    assert [c.placement for c in candidates] == ["actor", "gpu"]

    def first_look(cfg, rounds, updates):
        on_gpu = cfg.run.actor_gpus > 0
        return Screened(1024, [0.1 if on_gpu else 0.3] * rounds, 0.1 if updates else None, 1.0, wall_s=2.0,
                        gpu_mib=30_000.0 if on_gpu else None)

    def look(cfg, iterations, seconds):
        return Trained(3, 3000, 1.0, wall_s=2.0)

    plan = minibatches_per_epoch(config)
    results = search(lambda c: load_config(overrides={"env.id": "CartPole-v1"}, sets=c.sets(plan)), candidates,
                     budget_s=100, max_rss_mib=None, max_gpu_mib=20_000.0, say=lambda _: None, look=look,
                     first_look=first_look)
    assert results[0].candidate.placement == "actor" and results[0].status == "finalist"
    assert results[1].skipped == "over --max-gpu-mib 20000 (30,000 MiB of GPU memory)"
    assert results[1].trained is None and results[1].screened.gpu_mib == 30000


def test_finalists_whose_start_up_is_most_of_a_turn_get_one_turn_each() -> None:
    """A 2-core machine's Breakout: a start-up and warm-up of about a minute is trained once per finalist, not
    twice (a second start-up would eat the time it measures)."""
    config = load_config(overrides={"env.id": "CartPole-v1"})
    candidates = grid(config, cpus=2, gpus=0, actors=[1], envs=[config.env.num_envs], places=["actor", "halves"],
                      change_batch=True)
    clock, looks = Clock(), []

    def first_look(cfg, rounds, updates):
        clock.now += 60.0
        return Screened(1024, [1.0] * rounds, 9.0 if updates else None, 50.0, wall_s=60.0)

    def look(cfg, iterations, seconds):
        looks.append(seconds)
        clock.now += seconds + 60.0
        return Trained(5, int(100 * seconds), seconds, wall_s=seconds + 60.0)

    plan = minibatches_per_epoch(config)
    results = search(lambda c: load_config(overrides={"env.id": "CartPole-v1"}, sets=c.sets(plan)), candidates,
                     budget_s=400, finalists=2, say=lambda _: None, clock=lambda: clock.now, look=look,
                     first_look=first_look)
    assert len(looks) == 2 and all(seconds > 0 for seconds in looks)  # one turn per finalist
    assert [r.status for r in results] == ["finalist", "finalist"]
