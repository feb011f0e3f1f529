"""The single-process reference for `python -m benchmarks solve --reference`: Stable-Baselines3's PPO with the same
preset (same total envs, segment length, epochs, minibatch, learning rate and schedule, gamma, lambda, clip,
coefficients, network widths and activation, target KL), stopped at the same target return over the last
100 episodes. Run as a subprocess so its wall time, like dppo's rows, counts from launch to exit."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/reference.py")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--envs", type=int, required=True, help="total envs (dppo's actors x env.num_envs)")
    parser.add_argument("--out", type=Path, required=True, help="JSON summary to write")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="config override, as dppo train's")
    args = parser.parse_args(argv)
    started = time.perf_counter()

    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger

    from dppo.config import load_config

    config = load_config(overrides={"env.id": args.env}, sets=args.sets)
    ppo, target = config.ppo, config.run.target_return
    torch.set_num_threads(1)  # as dppo's learner (run.learner_threads 1)

    class StopAtTarget(BaseCallback):
        """SB3's own 100-episode window (ep_info_buffer), the same rule as dppo's run.target_return."""

        def _on_step(self) -> bool:
            buffer = self.model.ep_info_buffer
            return not (target is not None and len(buffer) == 100 and
                        sum(e["r"] for e in buffer) / 100 >= target)

    def learning_rate(progress_remaining: float) -> float:
        return ppo.learning_rate * (progress_remaining if ppo.anneal_lr else 1.0)

    env = make_vec_env(args.env, n_envs=args.envs, seed=args.seed)
    activation = torch.nn.Tanh if config.model.activation == "tanh" else torch.nn.ReLU
    model = PPO("MlpPolicy", env, n_steps=ppo.segment_length, batch_size=config.minibatch_size, n_epochs=ppo.epochs,
                learning_rate=learning_rate, gamma=ppo.gamma, gae_lambda=ppo.gae_lambda, clip_range=ppo.clip_coef,
                ent_coef=ppo.entropy_coef, vf_coef=ppo.value_coef, max_grad_norm=ppo.max_grad_norm,
                target_kl=ppo.target_kl, seed=args.seed, device="cpu",
                policy_kwargs={"net_arch": list(config.model.hidden_sizes), "activation_fn": activation})
    model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's default makes a /tmp/SB3-<time> dir a run
    train_start = time.perf_counter()
    model.learn(total_timesteps=config.run.total_steps, callback=StopAtTarget())
    buffer = model.ep_info_buffer
    mean = sum(e["r"] for e in buffer) / len(buffer) if buffer else None
    summary = {"solved": target is not None and len(buffer) == 100 and mean is not None and mean >= target,
               "env_steps": int(model.num_timesteps), "train_s": round(time.perf_counter() - train_start, 3),
               "startup_s": round(train_start - started, 3), "episode_return_mean": mean}
    args.out.write_text(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
