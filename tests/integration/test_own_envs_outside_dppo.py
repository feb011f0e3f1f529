"""dppo's own envs in a user's script: gymnasium 1.x loads no plugins (its entry-point plugin system was removed
in 1.0), so a fresh interpreter makes them the two ways the README shows, and with neither it cannot."""

from __future__ import annotations

import re
import subprocess
import sys

from runs import REPO

README = (REPO / "docs" / "training.md").read_text()  # its Export section (moved there from the README)


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)


def test_the_readme_s_module_form_makes_the_env_in_a_fresh_interpreter() -> None:
    shown = re.search(r'`(gym\.make\("dppo\.envs:dppo/CueCorridor-v0"\))`', README)
    assert shown, "README shows gym.make(\"dppo.envs:dppo/CueCorridor-v0\")"
    done = python(f"import sys, gymnasium as gym\nenv = {shown.group(1)}\nenv.reset(seed=0)\n"
                  "print(env.spec.id, 'torch' in sys.modules, 'ray' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["dppo/CueCorridor-v0", "False", "False"]


def test_importing_dppo_envs_registers_them_without_torch_or_ray() -> None:
    assert "`import dppo.envs` before" in README
    done = python("import sys, gymnasium as gym, dppo.envs\nenv = gym.make('dppo/CueCorridor-v0')\n"
                  "print(env.spec.max_episode_steps, 'torch' in sys.modules, 'ray' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["100", "False", "False"]


def test_without_either_gymnasium_does_not_know_the_namespace() -> None:
    """What the README's sentence answers: the bare id fails in a script that names no dppo module."""
    done = python("import gymnasium as gym\ngym.make('dppo/CueCorridor-v0')")
    assert done.returncode != 0 and "Namespace dppo not found" in done.stderr
