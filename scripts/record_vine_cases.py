"""Record VinePPO's Monte Carlo step advantages on seeded random episodes, for
``tests/core/test_vine.py``. VinePPO (McGill-NLP/VinePPO) is research code at a pinned
commit, not a package: this script imports its own source file
``src/treetune/episode_generators/math_episode_generator_with_mc_advantages.py`` from a
checkout given on the command line, runs three methods of
``MathEpisodeGeneratorWithMCAdvantages`` on each episode and writes inputs and outputs,
with the file's path, commit and sha256, to ``tests/data/peer_cases/vine_vineppo.json``:

- ``_compute_mc_value``: each state's value, the mean of its continuations' rewards (a
  continuation cut by the length limit gets the unfinished-response penalty);
- ``_compute_step_advantages``: ``A_k = r_k + V_{k+1} - V_k``, the values of states past
  ``max_step_for_value_estimation`` (None) filled from the end with the episode's return;
- ``_compute_token_advantages``: each response token gets the step of its first
  character, the EOS token the last token's.

    python scripts/record_vine_cases.py --source /path/to/VinePPO --commit <sha>

The methods are called on a stand-in ``self`` holding only what they read (a reward
function, a tokenizer's BOS/EOS ids, the step delimiter ""). The modules the file imports
but these methods never call (``treetune``'s framework, ``accelerate``, ``datasets``) are
empty stand-ins (``scripts/record_peer_cases.py``), listed in the recorded file; the
peer's code is never copied into this repository.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import random
import sys
import types
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_peer_cases import sha256, stand_in, write  # noqa: E402

FILE = "src/treetune/episode_generators/math_episode_generator_with_mc_advantages.py"
STAND_INS = ["treetune", "accelerate", "datasets", "tqdm"]
BOS, EOS = 1, 2
#: VinePPO's default unfinished-response penalty is 0; another number shows where it lands.
PENALTY = -0.25


def peer_class(source: Path):
    """The peer's class, its module imported from the checkout. Its registration decorator
    (``EpisodeGenerator.register``) must hand the class back, so that one name is a real
    module; everything else the file imports is an empty stand-in."""
    stand_in(STAND_INS)
    generators = types.ModuleType("treetune.episode_generators")
    generators.__path__ = []
    generators.EpisodeGenerator = SimpleNamespace(register=lambda name: (lambda cls: cls))
    generators.MathEpisodeGenerator = object
    sys.modules["treetune.episode_generators"] = generators
    spec = importlib.util.spec_from_file_location("vineppo_mc_advantages", source / FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MathEpisodeGeneratorWithMCAdvantages


class RewardFunction:
    """A continuation's reward: looked up by its answer text; the penalty for one cut by
    the length limit."""

    def __init__(self, rewards: dict[str, float]):
        self.rewards = rewards

    def __call__(self, query: str, answer: str, instance: dict) -> tuple[float, bool]:
        return self.rewards[answer], False

    def get_unfinished_response_penalty(self) -> float:
        return PENALTY


def stand_in_self(cls, answer_rewards: dict[str, float]) -> SimpleNamespace:
    """What the three methods read of ``self``."""
    me = SimpleNamespace(reward_function=RewardFunction(answer_rewards),
                         reasoning_step_delimiter="",
                         tokenizer=SimpleNamespace(bos_token_id=BOS, eos_token_id=EOS))
    me._compute_step_advantages = lambda traj: cls._compute_step_advantages(me, traj)
    return me


def continuations(rng: random.Random, name: str, answer_rewards: dict[str, float]) -> dict:
    """A state's reasoning tree: 1 to 6 continuations (VinePPO samples a fixed number; a
    varying one shows the mean is over those present), some cut by the length limit."""
    children = []
    for j in range(rng.randint(1, 6)):
        answer = f"{name}-{j}"
        answer_rewards[answer] = rng.choice([0.0, 1.0, 1.0, round(rng.uniform(-1, 1), 4)])
        children.append({"answer": answer, "finish_reason": rng.choice(["stop"] * 4 + ["length"])})
    return {"_treetune__reasoning_tree": json.dumps({"children": children})}


def tokens(rng: random.Random, text: str, start: int) -> list[tuple[int, int]]:
    """Character offsets of ``text`` cut into tokens of 1 to 4 characters."""
    offsets, i = [], 0
    while i < len(text):
        j = min(len(text), i + rng.randint(1, 4))
        offsets.append((start + i, start + j))
        i = j
    return offsets


def trajectory(rng: random.Random, n_steps: int, score: float) -> dict:
    query = "Q" * rng.randint(2, 5)
    # Steps of 4 or more characters and tokens of at most 4: a token may cross a step's
    # end, yet every step has a token that starts in it (a batch has no empty steps).
    steps = ["".join(rng.choice("abcdef") for _ in range(rng.randint(4, 9)))
             for _ in range(n_steps)]
    response = "".join(steps)
    indices = [0]
    for step in steps:
        indices.append(indices[-1] + len(step))
    query_offsets = tokens(rng, query, 0)
    offsets = query_offsets + tokens(rng, response, len(query))
    n_query = len(query_offsets)
    bos, eos = rng.random() < 0.5, rng.random() < 0.7
    return {"query_text": query, "response_text": response, "offsets": offsets, "steps": steps,
            "step_indices": indices,
            "query_token_ids": [BOS] * bos + [7] * n_query,
            "response_token_ids": [8] * (len(offsets) - n_query) + [EOS] * eos,
            "step_rewards": [0.0] * (n_steps - 1) + [score], "values": [None] * (n_steps + 1)}


def token_steps(traj: dict) -> list[int]:
    """The step of each response token (the EOS token's: the last one), by the same rule
    as the peer: the step holding the token's first character."""
    query, indices = len(traj["query_text"]), traj["step_indices"]
    out = [max(k for k in range(len(indices) - 1) if indices[k] <= start - query)
           for start, _ in traj["offsets"] if start >= query]
    return out + [len(indices) - 2] * (traj["response_token_ids"][-1:] == [EOS])


def episode(cls, rng: random.Random, max_step: int | None) -> dict:
    n_steps = rng.randint(1, 5)
    score = rng.choice([0.0, 1.0, PENALTY, round(rng.uniform(-1, 2), 4)])
    traj = trajectory(rng, n_steps, score)
    answer_rewards: dict[str, float] = {}
    me = stand_in_self(cls, answer_rewards)
    returns = []
    # VinePPO asks for the values of s_0 .. s_{n-1}, at most up to s_{max_step}.
    last = n_steps - 1 if max_step is None else min(n_steps - 1, max_step)
    for k in range(n_steps):
        if k > last:
            returns.append([])
            continue
        tree = continuations(rng, f"s{k}", answer_rewards)
        value, rewards = cls._compute_mc_value(me, query="", value_estimation_result=tree,
                                               data_instance={}, return_rewards=True)
        traj["values"][k] = value
        returns.append(rewards)
    step_advantages = cls._compute_step_advantages(me, copy.deepcopy(traj))
    filled = copy.deepcopy(traj)
    token_advantages = cls._compute_token_advantages(me, filled)
    return {"step_rewards": traj["step_rewards"], "mc_returns": returns,
            "values": filled["values"], "step_advantages": step_advantages,
            "token_steps": token_steps(traj),
            "token_advantages": [float(a) for a in token_advantages]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="a VinePPO checkout")
    parser.add_argument("--commit", required=True, help="the checkout's commit")
    args = parser.parse_args()
    source = args.source.resolve()
    cls = peer_class(source)
    cases = []
    for seed in range(10):
        rng = random.Random(seed)
        max_step = None if seed % 3 else rng.randint(0, 2)
        cases.append({"seed": seed, "max_step_for_value_estimation": max_step,
                      "episodes": [episode(cls, rng, max_step) for _ in range(rng.randint(2, 6))]})
    write("vine_vineppo", {
        "name": "VinePPO", "repository": "McGill-NLP/VinePPO", "commit": args.commit,
        "file": FILE, "sha256": sha256(source / FILE),
        "function": "MathEpisodeGeneratorWithMCAdvantages._compute_mc_value, "
                    "_compute_step_advantages, _compute_token_advantages",
        "stand_ins": STAND_INS, "unfinished_response_penalty": PENALTY},
        cases, "per episode: step_rewards, mc_returns[k] (the rewards of the continuations "
               "from the state before step k, [] where VinePPO estimates no value), values "
               "(V(s_0..s_n), filled), step_advantages, token_steps and token_advantages of the "
               "response tokens (EOS included)", recorded_by="scripts/record_vine_cases.py")


if __name__ == "__main__":
    main()
