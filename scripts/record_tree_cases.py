"""Record the tree estimators of Tree-GRPO and TreePO on seeded random trees, as
``scripts/record_peer_cases.py`` records ROLL's GiGPO: the peer's own source file, at a
pinned commit, is imported from a checkout given on the command line and run; the
inputs and outputs, with the file's path, commit and sha256, go to
``tests/data/peer_cases/<name>.json``. The peer's code is never copied into this
repository.

    # a checkout of AMAP-ML/Tree-GRPO at the pinned commit
    python scripts/record_tree_cases.py tree-grpo --source /path/to/Tree-GRPO --commit <hash>
    # a checkout of multimodal-art-projection/TreePO at the pinned commit
    python scripts/record_tree_cases.py treepo --source /path/to/TreePO --commit <hash>

A recorded case is a list of rows, one root-to-leaf path each: its prompt group, its tree
(Tree-GRPO samples several trees per prompt), the ids of the nodes it passes (unique
within the prompt group), the number of tokens of each node, and the leaf's reward.
Tree-GRPO's ``core_algos.py`` imports ``verl.utils.torch_functional``, which the recorded
functions never call: it is an empty stand-in. TreePO's function calls its vendored
``masked_whiten``: that module loads from the checkout (``verl/__init__`` skipped); it is
recorded once as released and once with that whitening replaced by the identity.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import random
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_peer_cases import bare_packages, sha256, stand_in, write  # noqa: E402

RECORDED_BY = "scripts/record_tree_cases.py"
REWARDS = ("binary", "graded", "continuous")


def random_tree(rng: random.Random, next_id: list[int], max_depth: int,
                lengths: dict[int, int], root_children: int) -> list[list[int]]:
    """The root-to-leaf node paths of one random tree under an implicit root (the
    prompt); ``lengths`` receives each node's token count."""
    def grow(depth: int) -> list[list[int]]:
        node = next_id[0]
        next_id[0] += 1
        lengths[node] = rng.randint(1, 3)
        n_children = 0 if depth >= max_depth else rng.choice([0, 1, 2, 2, 3])
        if n_children == 0:
            return [[node]]
        return [[node] + path for _ in range(n_children) for path in grow(depth + 1)]
    return [path for _ in range(root_children) for path in grow(1)]


def random_case(rng: random.Random, trees_per_group: int) -> list[dict]:
    """Prompt groups of random trees; one row per leaf."""
    rows = []
    kind = rng.choice(REWARDS)
    draw = {"binary": lambda: float(rng.random() < 0.5),
            "graded": lambda: rng.randint(0, 4) / 4,
            "continuous": lambda: round(rng.uniform(-1.0, 1.5), 6)}[kind]
    for group in range(rng.randint(1, 3)):
        next_id, lengths = [0], {}
        for tree in range(rng.randint(1, trees_per_group)):
            paths = random_tree(rng, next_id, rng.randint(1, 4), lengths, rng.randint(1, 3))
            for path in paths:
                rows.append({"group": group, "tree": tree, "path": path,
                             "lengths": [lengths[n] for n in path], "reward": draw()})
    return rows


def outcome_tensors(rows: list[dict]):
    """verl's layout: the reward on each row's last response token, the mask on its
    tokens."""
    import torch
    width = max(sum(r["lengths"]) for r in rows)
    rewards, mask = torch.zeros(len(rows), width), torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        n = sum(row["lengths"])
        rewards[i, n - 1] = row["reward"]
        mask[i, :n] = 1.0
    return rewards, mask


def load_file(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def per_row(values, rows: list[dict]) -> list[float]:
    return [float(values[i, 0]) for i in range(len(rows))]


def per_token(values, rows: list[dict]) -> list[list[float]]:
    return [values[i, :sum(r["lengths"])].tolist() for i, r in enumerate(rows)]


def record_tree_grpo(source: Path, commit: str) -> None:
    import numpy as np
    stand_in(["verl"])
    file = "verl/trainer/ppo/core_algos.py"
    algos = load_file(source / file, "tree_grpo_core_algos")
    cases = []
    for seed in range(10):
        rng = random.Random(seed)
        rows = random_case(rng, trees_per_group=3)
        rewards, mask = outcome_tensors(rows)
        index = np.array([f"prompt{r['group']}" for r in rows], dtype=object)
        tree_index = np.array([f"prompt{r['group']}-tree{r['tree']}" for r in rows], dtype=object)
        sequential, _ = algos.compute_tree_grpo_outcome_advantage(
            rewards.clone(), mask, index, tree_index)
        summed = [algos.compute_grpo_outcome_advantage(rewards.clone(), mask, ids)[0]
                  for ids in (index, tree_index)]
        tokens = [algos.compute_grpo_per_token_advantage(rewards.clone(), mask, ids)[0]
                  for ids in (index, tree_index)]
        cases.append({"seed": seed, "rows": rows,
                      "sequential": per_row(sequential, rows),
                      "sum": per_row(summed[0] + summed[1], rows),
                      "per_token": per_token(tokens[0] + tokens[1], rows)})
    write("tree_grpo", {"name": "Tree-GRPO", "repository": "AMAP-ML/Tree-GRPO",
                        "commit": commit, "file": file, "sha256": sha256(source / file),
                        "function": "compute_tree_grpo_outcome_advantage (adv_estimator "
                                    "tree_2norm); compute_grpo_outcome_advantage over uid plus "
                                    "over tree_uid (tree); compute_grpo_per_token_advantage over "
                                    "uid plus over tree_uid (tree_per_token); epsilon 1e-6",
                        "stand_ins": ["verl"]},
          cases, "sequential, sum: each row's advantage (every response token); per_token: "
                 "each row's advantage on each response token (the reward on the last one)",
          RECORDED_BY)


def record_treepo(source: Path, commit: str) -> None:
    import numpy as np
    bare_packages(source, ["verl", "verl.utils", "verl.trainer", "verl.trainer.ppo"])
    sys.path.insert(0, str(source))
    algos = importlib.import_module("verl.trainer.ppo.core_algos")
    file = "verl/trainer/ppo/core_algos.py"
    cases = []
    for seed in range(12):
        rng = random.Random(100 + seed)
        rows = random_case(rng, trees_per_group=1)
        rewards, mask = outcome_tensors(rows)
        # TreePO's uid: the prompt's id, then one '#'-separated part per node
        index = np.array(["#".join([f"prompt{r['group']}"] + [str(n) for n in r["path"]])
                          for r in rows], dtype=object)
        strategy = ("group_size", "average")[seed % 2]
        skip = seed % 4 >= 2
        run = lambda: algos.compute_tree_reinforce_plus_plus_baseline_outcome_advantage(  # noqa: E731
            rewards.clone(), mask, index, remove_no_std_subgroup=skip,
            adv_weight_strategy=strategy)[0]
        whitened = run()
        # the same call with the whitening its last line applies left out, to compare
        # the estimator apart from the whitening (the recipe's adv_norm whitens)
        whitening = algos.verl_F
        algos.verl_F = SimpleNamespace(masked_whiten=lambda values, mask, shift_mean=True: values)
        try:
            before = run()
        finally:
            algos.verl_F = whitening
        cases.append({"seed": seed, "adv_weight_strategy": strategy,
                      "remove_no_std_subgroup": skip, "rows": rows,
                      "advantages": per_row(whitened, rows),
                      "before_whitening": per_row(before, rows)})
    write("treepo", {"name": "TreePO", "repository": "multimodal-art-projection/TreePO",
                     "commit": commit, "file": file, "sha256": sha256(source / file),
                     "function": "compute_tree_reinforce_plus_plus_baseline_outcome_advantage "
                                 "(its masked_whiten from verl/utils/torch_functional.py)",
                     "stand_ins": []},
          cases, "advantages: each row's advantage (every response token), after TreePO's "
                 "whitening over the batch's response tokens; before_whitening: the same call "
                 "with core_algos.verl_F.masked_whiten replaced by the identity", RECORDED_BY)


RECORDERS = {"tree-grpo": record_tree_grpo, "treepo": record_treepo}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("peer", choices=sorted(RECORDERS))
    parser.add_argument("--source", type=Path, required=True, help="the peer's checkout")
    parser.add_argument("--commit", required=True, help="the checkout's commit")
    args = parser.parse_args()
    RECORDERS[args.peer](args.source.resolve(), args.commit)


if __name__ == "__main__":
    main()
