"""Record peers' advantage estimators on random batches, for the peers that cannot be
imported in the test environment: ROLL's GiGPO (code at a pinned commit, not on PyPI),
prime-rl's MaxRL (not on PyPI) and SkyRL's MaxRL (its PyPI wheel, skyrl 0.3.0, does not
import on Python 3.11). Each recorder imports the peer's own source file from a path
given on the command line, runs the peer's function on seeded random groups, and
writes the inputs and outputs, with the file's path, commit and sha256, to
``tests/data/peer_cases/<name>.json``; the tests compare our stages with these numbers
and check the pin. The peer's code is never copied into this repository.

    # ROLL: a checkout of alibaba/ROLL at the pinned commit (its directory holding roll/)
    python scripts/record_peer_cases.py gigpo-roll --source /path/to/ROLL
    # prime-rl: a checkout of PrimeIntellect-ai/prime-rl at the pinned commit
    python scripts/record_peer_cases.py maxrl-prime-rl --source /path/to/prime-rl
    # SkyRL: the unpacked wheel (pip download --no-deps skyrl==0.3.0; unzip it)
    python scripts/record_peer_cases.py maxrl-skyrl --source /path/to/unpacked/wheel

``--commit`` records the checkout's commit (for the wheel: its version). Modules the peer
file imports but the recorded function never calls (ROLL's GIF writer ``imageio`` and
transfer queue; prime-rl's verifiers, configs, logger and transports; SkyRL's config
package) are replaced by empty stand-ins, listed in the recorded file.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import json
import random
import sys
import types
from pathlib import Path
from types import SimpleNamespace

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "peer_cases"


# ---------------------------------------------------------------------------- imports

class _Anything:
    """What a stand-in module hands out for any name: callable, subclassable."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Anything()

    def __getattr__(self, name):
        return _Anything()

    def __mro_entries__(self, bases):
        return (object,)


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty modules for the given dotted prefixes (and everything below them)."""

    def __init__(self, prefixes):
        self.prefixes = tuple(prefixes)

    def find_spec(self, name, path=None, target=None):
        if any(name == p or name.startswith(p + ".") for p in self.prefixes):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def attribute(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Anything()
        module.__getattr__ = attribute
        return module

    def exec_module(self, module):
        pass


def stand_in(prefixes: list[str]) -> None:
    sys.meta_path.insert(0, _StandIns(prefixes))


def bare_packages(root: Path, names: list[str]) -> None:
    """Packages whose ``__init__`` is skipped (it imports the whole framework); their
    modules load from ``root`` as usual."""
    for name in names:
        module = types.ModuleType(name)
        module.__path__ = [str(root / name.replace(".", "/"))]
        sys.modules[name] = module


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write(name: str, peer: dict, cases: list[dict], note: str,
          recorded_by: str = "scripts/record_peer_cases.py") -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    data = {"peer": peer, "recorded_by": recorded_by, "note": note, "cases": cases}
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path} ({len(cases)} cases)")


# ---------------------------------------------------------------------------- MaxRL

def reward_groups(rng: random.Random) -> list[list[float]]:
    """Prompt groups of non-negative rewards, as both peers assume: binary, graded in
    quarters, continuous, one all-zero group and one group of one response."""
    groups = []
    for kind in ("binary", "graded", "continuous", "binary", "graded"):
        n = rng.randint(2, 8)
        draw = {"binary": lambda: float(rng.random() < 0.4),
                "graded": lambda: rng.randint(0, 4) / 4,
                "continuous": lambda: round(rng.uniform(0.0, 1.5), 6)}[kind]
        groups.append([draw() for _ in range(n)])
    groups.append([0.0] * rng.randint(2, 6))
    groups.append([rng.choice([0.0, 1.0, 0.5])])
    return groups


def record_maxrl_prime_rl(source: Path, commit: str) -> None:
    stand_in(["verifiers", "renderers", "prime_rl.configs", "prime_rl.utils",
              "prime_rl.transports"])
    bare_packages(source / "src", ["prime_rl", "prime_rl.orchestrator", "prime_rl.orchestrator.algo"])
    sys.path.insert(0, str(source / "src"))
    algo = importlib.import_module("prime_rl.orchestrator.algo.max_rl")
    file = "src/prime_rl/orchestrator/algo/max_rl.py"

    def run(rewards: list[float]) -> list[float]:
        traces = [SimpleNamespace(id=str(i), reward=r, has_error=False,
                                  agent=SimpleNamespace(trainable=True),
                                  nodes=[SimpleNamespace(mask=[1, 1], token_ids=[5, 6])])
                  for i, r in enumerate(rewards)]
        episodes = [SimpleNamespace(traces=[t]) for t in traces]
        asyncio.run(algo.MaxRLAlgorithm(None, policy_pool=None).score_group(episodes))
        return [t.nodes[0].advantages[0] for t in traces]

    cases = []
    for seed in range(8):
        groups = reward_groups(random.Random(seed))
        cases.append({"seed": seed, "groups": groups, "advantages": [run(g) for g in groups]})
    write("maxrl_prime_rl", {"name": "prime-rl", "repository": "PrimeIntellect-ai/prime-rl",
                             "commit": commit, "file": file, "sha256": sha256(source / file),
                             "function": "MaxRLAlgorithm.score_group",
                             "stand_ins": ["verifiers", "renderers", "prime_rl.configs",
                                           "prime_rl.utils", "prime_rl.transports"]},
          cases, "advantages: each rollout's scalar advantage (assigned to every sampled token)")


def record_maxrl_skyrl(source: Path, commit: str) -> None:
    import numpy as np
    import torch

    stand_in(["skyrl.train.config"])
    bare_packages(source, ["skyrl", "skyrl.backends", "skyrl.train"])
    sys.path.insert(0, str(source))
    ppo = importlib.import_module("skyrl.backends.skyrl_train.utils.ppo_utils")
    file = "skyrl/backends/skyrl_train/utils/ppo_utils.py"

    cases = []
    for seed in range(8):
        groups = reward_groups(random.Random(100 + seed))
        flat = [r for g in groups for r in g]
        width = 3
        rewards = torch.zeros(len(flat), width)
        rewards[:, -1] = torch.tensor(flat)
        index = np.array([i for i, g in enumerate(groups) for _ in g])
        adv, _ = ppo.compute_maxrl_advantage(token_level_rewards=rewards,
                                             response_mask=torch.ones(len(flat), width), index=index)
        out, start = [], 0
        for g in groups:
            out.append(adv[start:start + len(g), 0].tolist())
            start += len(g)
        cases.append({"seed": seed, "groups": groups, "advantages": out})
    write("maxrl_skyrl", {"name": "SkyRL", "package": "skyrl==0.3.0 (PyPI wheel)",
                          "commit": commit, "file": file, "sha256": sha256(source / file),
                          "function": "compute_maxrl_advantage (epsilon=1e-6)",
                          "stand_ins": ["skyrl.train.config"]},
          cases, "advantages: each rollout's scalar advantage (every response token)")


# ---------------------------------------------------------------------------- GiGPO

def gigpo_groups(rng: random.Random, shared_states: bool) -> list[list[dict]]:
    """Prompt groups of episodes; each episode a list of steps with a step score and an
    anchor state id, and its episode score the sum of its step scores (as ROLL's
    ``StepEnvManager`` computes it). Few states per step index, so anchor groups of
    several steps form; ``shared_states``: prompt groups reuse the same state ids."""
    groups = []
    for g in range(rng.randint(2, 4)):
        episodes = []
        for _ in range(rng.randint(1, 6)):
            steps = rng.randint(1, 4)
            base = 0 if shared_states else 1000 * (g + 1)
            scores = [rng.choice([0.0, 0.0, -0.1, 0.2, round(rng.uniform(-1, 1), 4)])
                      for _ in range(steps - 1)]
            scores.append(rng.choice([0.0, 1.0, 0.5, round(rng.uniform(-1, 2), 4)]))
            episodes.append({"episode_score": sum(scores), "step_scores": scores,
                             "states": [base + 10 * k + rng.randint(0, 2) for k in range(steps)]})
        groups.append(episodes)
    return groups


def roll_batch(groups: list[list[dict]], shuffle: random.Random):
    """ROLL's step-wise DataProto: one row per step, in a shuffled order."""
    import numpy as np
    import torch
    from roll.distributed.scheduler.protocol import DataProto

    rows = [(g, e, k) for g, group in enumerate(groups) for e, ep in enumerate(group)
            for k in range(len(ep["step_scores"]))]
    shuffle.shuffle(rows)
    ep = lambda g, e: groups[g][e]  # noqa: E731
    non_tensors = {
        "traj_group_id": np.array([f"group{g}" for g, _, _ in rows], dtype=object),
        "traj_id": np.array([f"group{g}-traj{e}" for g, e, _ in rows], dtype=object),
        "step": np.array([k for _, _, k in rows], dtype=object),
        "step_scores": np.array([ep(g, e)["step_scores"][k] for g, e, k in rows], dtype=object),
        "episode_scores": np.array([ep(g, e)["episode_score"] for g, e, _ in rows], dtype=object),
        "state_hash": np.array([str(ep(g, e)["states"][k]) for g, e, k in rows], dtype=object),
    }
    tensors = {"response_mask": torch.ones(len(rows), 4)}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors), rows


def record_gigpo_roll(source: Path, commit: str) -> None:
    stand_in(["imageio", "transfer_queue"])
    sys.path.insert(0, str(source))
    utils = importlib.import_module("roll.pipeline.agentic.utils")
    config = importlib.import_module("roll.pipeline.agentic.agentic_config")
    file = "roll/pipeline/agentic/utils.py"

    cases = []
    for seed in range(12):
        rng = random.Random(seed)
        method = ("mean", "mean_std")[seed % 2]
        gamma = (0.95, 1.0, 0.8)[seed % 3]
        weights = ((1.0, 1.0), (1.0, 0.5), (0.7, 1.3))[seed % 3]
        shared = seed >= 10   # the last two: state ids shared across prompt groups
        groups = gigpo_groups(rng, shared)
        batch, rows = roll_batch(groups, rng)
        batch = utils.compute_discounted_returns(batch, "gigpo", gamma)
        pipeline = SimpleNamespace(
            adv_estimator="gigpo", reward_clip=None, episode_reward_weight=weights[0],
            step_reward_weight=weights[1],
            reward_normalization=config.RewardNormalizationConfig(grouping="traj_group_id",
                                                                  method=method))
        batch, _ = utils.compute_response_level_rewards(batch, pipeline)
        values = batch.batch["response_level_rewards"].tolist()
        advantages = [[[0.0] * len(ep["step_scores"]) for ep in group] for group in groups]
        for (g, e, k), value in zip(rows, values):
            advantages[g][e][k] = value
        cases.append({"seed": seed, "method": method, "step_reward_gamma": gamma,
                      "episode_reward_weight": weights[0], "step_reward_weight": weights[1],
                      "states_shared_across_groups": shared, "groups": groups,
                      "advantages": advantages})
    write("gigpo_roll", {"name": "ROLL", "repository": "alibaba/ROLL", "commit": commit,
                         "file": file, "sha256": sha256(source / file),
                         "function": "compute_discounted_returns + compute_response_level_rewards "
                                     "(adv_estimator gigpo, reward_normalization.grouping "
                                     "traj_group_id)",
                         "stand_ins": ["imageio", "transfer_queue"]},
          cases, "advantages[group][episode][step]: ROLL's response_level_rewards of the step's "
                 "row (before the token broadcast, whitening and clipping that follow)")


RECORDERS = {"gigpo-roll": record_gigpo_roll, "maxrl-prime-rl": record_maxrl_prime_rl,
             "maxrl-skyrl": record_maxrl_skyrl}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("peer", choices=sorted(RECORDERS))
    parser.add_argument("--source", type=Path, required=True,
                        help="the peer's checkout (or unpacked wheel)")
    parser.add_argument("--commit", required=True,
                        help="the checkout's commit (or the wheel's version)")
    args = parser.parse_args()
    RECORDERS[args.peer](args.source.resolve(), args.commit)


if __name__ == "__main__":
    main()
