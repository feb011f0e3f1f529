"""The ``model`` and ``ppo`` sections: the networks and the PPO update's hyperparameters."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from dppo.config.base import Section

DEFAULT_MINIBATCH_SIZE = 256


class ModelConfig(Section):
    hidden_sizes: list[int] = Field(default_factory=lambda: [64, 64])
    """Widths of the hidden layers of the policy and value MLPs (separate networks)."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden-layer activation."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy (continuous actions only)."""
    action_mask_key: str | None = "action_mask"
    """The key of a Dict observation that holds an action mask (0/1 per action of a Discrete, per value of each
    MultiDiscrete component): masked actions get probability 0 when sampling, training, evaluating and in
    exported policies. The default key is used when the observation has it; another key must be there; null:
    no mask."""
    mask_in_network: bool = False
    """Also feed the mask to the network as input (it always masks the distribution)."""
    value_only_key: str | None = None
    """The key of a Dict observation that only the value network sees, never the policy: a centralized critic
    (MAPPO: env.global_state sets it to global_state, the env's global state beside each agent's observation), so
    the policy still acts on what its agent observes. Vector observations, feed-forward models."""
    recurrent: Literal["none", "lstm"] = "none"
    """lstm: an LSTM between the encoder and the policy and value heads, for envs where one observation is not
    enough. Actors carry its state across steps and segments and reset it where an episode ends; the update
    replays whole env columns (a minibatch is a multiple of ppo.segment_length)."""
    lstm_hidden_size: int = Field(128, ge=1)
    """Units of the LSTM (model.recurrent: lstm)."""
    encoder: Literal["auto", "nature", "small", "flatten"] = "auto"
    """Image encoder: nature (NatureCNN, images of 36 x 36 and more: Atari), small (2 x 2 convolutions, for grids
    such as MiniGrid's 7 x 7 view), flatten (the pixels into the MLP); auto picks nature or small by size."""
    entry_point: str | None = None
    """module.path:name of a network of one's own instead of the built-in one: a torch nn.Module class (or a function
    returning one) called as name(observation_space, action_space, model_config); its forward takes the observation
    as dppo encodes it (a float tensor (B, D): Dict/Tuple leaves flattened, discrete ones one-hot, normalized with
    env.normalize_obs; an image space's uint8 tensor (B, H, W, C); both: forward(image, vector)) and returns
    (action-head output (B, out_dim), value (B,)): logits (Discrete n, MultiDiscrete sum of nvec, MultiBinary n) or
    the Gaussian's mean (Box). Checked at start on a dummy batch. hidden_sizes, activation and encoder are the
    built-in network's and unused; feed-forward only (not with recurrent: lstm or value_only_key). The module must
    be importable in the driver and every Ray worker, as an env's code (run.runtime_env on a cluster)."""

    @field_validator("hidden_sizes")
    @classmethod
    def _positive_widths(cls, sizes: list[int]) -> list[int]:
        if not sizes or any(s < 1 for s in sizes):
            raise ValueError("needs at least one layer and every width >= 1, e.g. [64, 64]")
        return sizes

    @field_validator("entry_point")
    @classmethod
    def _entry_point_format(cls, value: str | None) -> str | None:
        if value is not None and (value.count(":") != 1 or value.startswith(":") or value.endswith(":")
                                  or not value.strip()):
            raise ValueError(f"{value!r} is not module.path:name; write e.g. mypackage.nets:MyNet")
        return value


class PPOConfig(Section):
    segment_length: int = Field(128, ge=1)
    """T: steps each actor collects per env per iteration."""
    epochs: int = Field(4, ge=1)
    """K: passes over the batch per iteration."""
    minibatch_size: int | None = Field(DEFAULT_MINIBATCH_SIZE, ge=1)
    """Samples per SGD step; must not exceed the batch (actors x num_envs x segment_length). Set this or
    num_minibatches, not both (giving num_minibatches drops this default). A fixed size gives more SGD steps per
    epoch as actors are added."""
    num_minibatches: int | None = Field(None, ge=1)
    """SGD steps per epoch instead of a size (CleanRL's and rl_games' rule): each minibatch is the batch divided by
    this, rounded down to whole units (one sample per learner; recurrent: one env column per learner), so more
    actors give larger minibatches, not more steps. Set this or minibatch_size, not both."""
    learning_rate: float = Field(2.5e-4, gt=0)
    """Adam step size (eps is fixed at 1e-5, as in the reference implementation). Never scaled with the batch:
    more actors keep this rate, and with num_minibatches the SGD steps per epoch too, so each step averages more
    samples. A larger batch may take a larger rate, but as a preset's tuned value, not a rule: rl_games' EnvPool
    Breakout uses 64 envs x 128 steps in 8 minibatches of 1,024 at 8e-4, CleanRL's Atari PPO 8 x 128 in 4 of 256
    at 2.5e-4."""
    anneal_lr: bool = True
    """Linearly anneal the learning rate to 0 over total_steps."""
    gamma: float = Field(0.99, ge=0, le=1)
    """Discount factor."""
    gae_lambda: float = Field(0.95, ge=0, le=1)
    """GAE lambda."""
    clip_coef: float = Field(0.2, gt=0)
    """Clipping range of the probability ratio."""
    clip_value_loss: bool = False
    """Clip the value update to value_clip_coef around the old value (the PPO reference code does; off by
    default because with unnormalized returns in the hundreds a 0.2 clip stalls the critic)."""
    value_clip_coef: float | None = Field(None, gt=0)
    """Clipping range of the value update when clip_value_loss is on; null uses clip_coef (the PPO reference
    code's choice; CleanRL, PufferLib and Stable-Baselines3 give it its own coefficient)."""
    value_coef: float = Field(0.5, ge=0)
    """Weight of the value loss."""
    entropy_coef: float = Field(0.01, ge=0)
    """Weight of the entropy bonus."""
    max_grad_norm: float = Field(0.5, gt=0)
    """Global gradient-norm clip."""
    target_kl: float | None = Field(None, gt=0)
    """Stop the epochs of an iteration early when approx-KL exceeds this (off when null)."""
    normalize_advantages: bool = True
    """Normalize advantages per minibatch."""
    normalize_value: bool = False
    """The value head learns returns normalized by their running mean and std (rl_games' normalize_value), so the
    critic's scale does not depend on the env's rewards: the learner turns the values the actors recorded back
    into returns for GAE with the statistics of the weights that sampled them, then updates the statistics with
    the batch's returns. The statistics live in the checkpoint; exported policies are unchanged."""

    @model_validator(mode="before")
    @classmethod
    def _one_rule_given(cls, data: Any) -> Any:
        """A count given without a size replaces the default size; neither given (or both null): the default size,
        what every run without one has always used."""
        if not isinstance(data, dict):
            return data
        if data.get("num_minibatches") is None and data.get("minibatch_size") is None:
            return {**data, "minibatch_size": DEFAULT_MINIBATCH_SIZE}
        if data.get("num_minibatches") is not None and "minibatch_size" not in data:
            return {**data, "minibatch_size": None}
        return data

    def minibatch_rows(self, batch: int, unit: int) -> int:
        """Samples per SGD step for a batch of ``batch`` samples that minibatches take in whole units of ``unit``
        samples: minibatch_size, or the batch / num_minibatches rounded down to whole units (0: less than one).
        Config.minibatch_size is this for a full batch; the Trainer asks it of each batch it trains on."""
        if self.minibatch_size is not None:
            return self.minibatch_size
        assert self.num_minibatches is not None  # the validator above leaves one rule
        return batch // self.num_minibatches // unit * unit

    @property
    def value_clip_range(self) -> float:
        """The value update's clipping range: value_clip_coef, else clip_coef."""
        return self.clip_coef if self.value_clip_coef is None else self.value_clip_coef
