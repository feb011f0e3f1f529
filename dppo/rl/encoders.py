"""Image encoders: the image part of an observation to a feature vector, chosen by the image's size.

NatureCNN (Mnih et al. 2015, as in CleanRL's Atari PPO) needs at least 36 x 36 pixels: its 8 x 8 stride-4 first
layer leaves nothing of a 7 x 7 MiniGrid view. Small images get a small CNN of 2 x 2 convolutions (the MiniGrid
models of the rl-starter-files); ``flatten`` feeds the pixels to the MLP as they are. ``model.encoder: auto``
picks by size.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dppo.errors import UnsupportedSpace

NATURE_MIN_SIZE = 36  # 36 -> 8 -> 3 -> 1 through NatureCNN's three convolutions
SMALL_MIN_SIZE = 3  # 3 -> 2 -> 1 through the small CNN's 2 x 2 convolutions


def layer_init(layer: nn.Module, gain: float, bias: float = 0.0) -> nn.Module:
    """Orthogonal weights, constant bias: sqrt(2) hidden, 0.01 policy head, 1.0 value head."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


class ImageEncoder(nn.Module):
    """uint8 (B, H, W, C) or (B, C, H, W) in, (B, out_dim) features out; ``kind`` names it in messages."""

    kind = ""
    out_dim = 0

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.channels_last = shape[-1] <= 4 and shape[0] > 4
        self.channels = shape[-1] if self.channels_last else shape[0]
        self.size = (shape[0], shape[1]) if self.channels_last else (shape[1], shape[2])

    def pixels(self, obs: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) floats in [0, 1]."""
        x = obs.float() / 255.0
        return x.permute(0, 3, 1, 2) if self.channels_last else x


class NatureCNN(ImageEncoder):
    """The DQN/PPO Atari encoder (Mnih et al. 2015): three convolutions and a 512-unit layer."""

    kind = "nature"
    out_dim = 512

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__(shape)
        self.net = nn.Sequential(
            layer_init(nn.Conv2d(self.channels, 32, 8, stride=4), math.sqrt(2)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2), math.sqrt(2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1), math.sqrt(2)), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.net(torch.zeros(1, self.channels, *self.size)).shape[1]
        self.head = nn.Sequential(layer_init(nn.Linear(flat, self.out_dim), math.sqrt(2)), nn.ReLU())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(self.pixels(obs)))


class SmallCNN(ImageEncoder):
    """Three 2 x 2 convolutions (16, 32, 64 channels) for images of a few cells a side (MiniGrid's 7 x 7 view)."""

    kind = "small"

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__(shape)
        layers: list[nn.Module] = []
        channels, size = self.channels, min(self.size)
        for width in (16, 32, 64):
            if size < 2:
                break
            layers += [layer_init(nn.Conv2d(channels, width, 2), math.sqrt(2)), nn.ReLU()]
            channels, size = width, size - 1
        self.net = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            self.out_dim = int(self.net(torch.zeros(1, self.channels, *self.size)).shape[1])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(self.pixels(obs))


class FlattenImage(ImageEncoder):
    """The pixels as they are, scaled to [0, 1], for the MLP."""

    kind = "flatten"

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__(shape)
        self.out_dim = int(math.prod(shape))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.pixels(obs).flatten(1)


def image_encoder(shape: tuple[int, ...], choice: str) -> ImageEncoder:
    """The encoder ``model.encoder`` names; ``auto``: NatureCNN from 36 x 36 up, the small CNN below."""
    probe = FlattenImage(shape)
    side = min(probe.size)
    if choice == "auto":
        choice = "nature" if side >= NATURE_MIN_SIZE else "small" if side >= SMALL_MIN_SIZE else "flatten"
    if choice == "nature" and side < NATURE_MIN_SIZE:
        raise UnsupportedSpace(f"model.encoder=nature needs images of at least {NATURE_MIN_SIZE} x "
                               f"{NATURE_MIN_SIZE} pixels, this one is {probe.size[0]} x {probe.size[1]}; use "
                               "model.encoder=auto, small or flatten")
    return {"nature": NatureCNN, "small": SmallCNN, "flatten": FlattenImage}[choice](shape)
