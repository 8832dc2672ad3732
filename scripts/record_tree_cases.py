"""Record the tree estimators of Tree-GRPO, TreePO and TreeRL on seeded random trees, as
``scripts/record_peer_cases.py`` records ROLL's GiGPO: the peer's own source file, at a
pinned commit, is imported from a checkout given on the command line and run; the
inputs and outputs, with the file's path, commit and sha256, go to
``tests/data/peer_cases/<name>.json``. The peer's code is never copied into this
repository.

    # a checkout of AMAP-ML/Tree-GRPO at the pinned commit
    python scripts/record_tree_cases.py tree-grpo --source /path/to/Tree-GRPO --commit <hash>
    # a checkout of multimodal-art-projection/TreePO at the pinned commit
    python scripts/record_tree_cases.py treepo --source /path/to/TreePO --commit <hash>
    # a checkout of THUDM/TreeRL at the pinned commit
    python scripts/record_tree_cases.py treerl --source /path/to/TreeRL --commit <hash>

A recorded case is a list of rows, one root-to-leaf path each: its prompt group, its tree
(Tree-GRPO samples several trees per prompt), the ids of the nodes it passes (unique
within the prompt group), the number of tokens of each node, and the leaf's reward.
Tree-GRPO's ``core_algos.py`` imports ``verl.utils.torch_functional``, which the recorded
functions never call: it is an empty stand-in. TreePO's function calls its vendored
``masked_whiten``: that module loads from the checkout (``verl/__init__`` skipped); it is
recorded once as released and once with that whitening replaced by the identity.
TreeRL's ``parallel_mcts.py`` imports its sampler's dependencies (stand-ins) and opens
three API config files at import (empty ones, in a temporary directory).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import os
import random
import sys
import tempfile
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
    sys.modules[name] = module   # pydantic resolves the annotations through it
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
        estimator = algos.compute_tree_reinforce_plus_plus_baseline_outcome_advantage
        run = lambda: estimator(rewards.clone(), mask, index,  # noqa: E731
                                remove_no_std_subgroup=skip, adv_weight_strategy=strategy)[0]
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


TREERL_CONFIG_FILES = ("api_config_llama3.1_max_request_1.json", "api_qwen72_v6_rm.json",
                       "api_extractor.json")
TREERL_STAND_INS = ["Levenshtein", "vllm", "multiprocess", "openrlhf", "evaluation"]


def load_treerl(source: Path):
    """TreeRL's ``tree_node.py`` and ``parallel_mcts.py``. The latter reads three API
    config files at import (for its reward servers, never used here): empty ones
    (``{"ip": {}}``) in a temporary working directory."""
    stand_in(TREERL_STAND_INS)
    folder = source / "openrlhf" / "trainer" / "ppo_utils"
    tree_node = load_file(folder / "tree_node.py", "treerl_tree_node")
    here = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        configs = Path(tmp) / "tools" / "api_configs"
        configs.mkdir(parents=True)
        for name in TREERL_CONFIG_FILES:
            (configs / name).write_text(json.dumps({"ip": {}}))
        os.chdir(tmp)
        try:
            mcts = load_file(folder / "parallel_mcts.py", "treerl_parallel_mcts")
        finally:
            os.chdir(here)
    return tree_node, mcts


def treerl_values(tree_node, mcts, rows: list[dict], norm: str, state_value: bool) -> list:
    """TreeRL's per-node values of each row of one prompt group: its MCTSNode tree built
    from the rows (the prompt the root, every leaf a trained path, as with
    ``use_all_terminals``), ``leaf_normalize`` and ``gather_paths``."""
    root = tree_node.MCTSNode(answer="", answer_token=[])
    made, leaves = {}, []
    for row in rows:
        parent = root
        for k, (node, length) in enumerate(zip(row["path"], row["lengths"])):
            if node not in made:
                leaf = k == len(row["path"]) - 1
                made[node] = tree_node.MCTSNode(
                    answer="", answer_token=[7] * length, parent=parent, depth=k + 1,
                    terminal=leaf, R=row["reward"] if leaf else 0.0,
                    main_chain=leaf and row["reward"] == 1.0)
                parent.children.append(made[node])
            parent = made[node]
        leaves.append(parent)
    with contextlib.redirect_stdout(io.StringIO()):   # both print as they go
        tree_node.leaf_normalize(leaves, root, False, norm, False)
        paths = mcts.gather_paths(root, leaves, len(leaves), use_state_value_reward=state_value)
    return [[step["value"] for step in path] for path in paths]


def record_treerl(source: Path, commit: str) -> None:
    tree_node, mcts = load_treerl(source)
    folder = "openrlhf/trainer/ppo_utils/"
    settings = [("token", True), ("step", True), ("token", False), ("none", True)]
    cases = []
    for seed in range(12):
        rng = random.Random(200 + seed)
        rows = [r for r in random_case(rng, trees_per_group=1)]
        groups = sorted({r["group"] for r in rows})
        if any(sum(r["group"] == g for r in rows) < 2 for g in groups):
            continue   # TreeRL's leave-one-out asserts two leaves or more
        norm, state_value = settings[len(cases) % len(settings)]
        values = [v for g in groups for v in treerl_values(
            tree_node, mcts, [r for r in rows if r["group"] == g], norm, state_value)]
        cases.append({"seed": 200 + seed, "overall_norm_style": norm,
                      "use_state_value_reward": state_value, "rows": rows, "values": values})
    write("treerl", {"name": "TreeRL", "repository": "THUDM/TreeRL", "commit": commit,
                     "file": folder + "tree_node.py",
                     "sha256": sha256(source / folder / "tree_node.py"),
                     "file_2": folder + "parallel_mcts.py",
                     "sha256_2": sha256(source / folder / "parallel_mcts.py"),
                     "function": "tree_node.leaf_normalize (average_one_generation=False, "
                                 "inner_repetition_penalty=False) then parallel_mcts.gather_paths "
                                 "over every leaf",
                     "stand_ins": TREERL_STAND_INS,
                     "stand_in_files": [f"tools/api_configs/{n}" for n in TREERL_CONFIG_FILES]},
          cases, "values[row][k]: gather_paths' 'value' of the row's k-th node (every token of "
                 "the node)", RECORDED_BY)


RECORDERS = {"tree-grpo": record_tree_grpo, "treepo": record_treepo, "treerl": record_treerl}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("peer", choices=sorted(RECORDERS))
    parser.add_argument("--source", type=Path, required=True, help="the peer's checkout")
    parser.add_argument("--commit", required=True, help="the checkout's commit")
    args = parser.parse_args()
    RECORDERS[args.peer](args.source.resolve(), args.commit)


if __name__ == "__main__":
    main()
