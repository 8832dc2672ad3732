"""What a Hugging Face run keeps and refuses (issue 27): the shipped HF configs evaluate
(a dataset holds out prompts), an adapter export loads from anywhere, a LoRA target
that matches nothing and a hub id that cannot be downloaded are one error line, and the
weights files are readable as the umask says."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_adv.cli import main
from lightning_adv.trainer import PolicyConfig, TaskConfig
from lightning_adv.trainer.policies.hf.policy import build_hf_policy, check_hf_policy
from lightning_adv.trainer.tasks.runtime import TaskRuntime
from lightning_adv.trainer.policies.hf.make_tiny import make_tiny
from tests.support.cli_runs import SMALL, scalars

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
IDS = torch.tensor([[1, 20, 30, 40, 50, 60]])


def hf_run(config, save_dir, model_dir, *extra):
    """``fit`` with a shipped HF config as it is (its dataset, no task.num_prompts), small."""
    main(["fit", "--config", str(CONFIGS / f"{config}.yaml"), f"--model.policy.pretrained={model_dir}",
          f"--model.task.dataset={REPO / 'data' / 'reverse_text.jsonl'}",
          f"--trainer.logger.init_args.save_dir={save_dir}", "--trainer.max_epochs=1", *SMALL, *extra])


def test_a_dataset_holds_out_two_evaluation_sets_by_default():
    shipped = yaml.safe_load((CONFIGS / "hf_grpo.yaml").read_text())["model"]["task"]
    config = TaskConfig(**{**shipped, "dataset": str(REPO / shipped["dataset"])})
    assert config.num_prompts is None
    runtime = TaskRuntime(config, held_out=2 * 64)  # evaluation.num_prompts: 64 by default
    assert runtime.task.pool_size == 2000 and runtime.num_prompts == 2000 - 128


@pytest.mark.parametrize("config", ["hf_grpo", "hf_ppo"])
def test_the_shipped_hf_configs_evaluate(config, tiny_lm, tmp_path):
    hf_run(config, tmp_path, tiny_lm)
    logged = scalars(tmp_path / config / "version_0")
    for tag in ("val/reward_greedy", "val/reward_mean", "val/pass@1"):
        assert tag in logged, sorted(logged)


def test_a_dataset_config_whose_evaluation_set_is_empty_is_refused(tiny_lm, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        hf_run("hf_grpo", tmp_path, tiny_lm, "--model.task.num_prompts=2000")
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    first = err.splitlines()[0]
    assert first.startswith("error: model.task.num_prompts: the dataset's 2000 prompts leave 0"), err
    assert "task.num_prompts: null" in first and "evaluation.num_prompts: 0" in first
    assert not (tmp_path / "hf_grpo").exists()


def test_a_lora_target_that_matches_nothing_is_one_usage_error(tiny_lm, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        hf_run("hf_ppo", tmp_path, tiny_lm, "--model.policy.lora.target_modules=[qproj]")
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: model.policy.lora.target_modules: ['qproj'] matches no "
                               "module of the 'qwen2' model"), err
    assert "q_proj" in lines[0] and len(lines) == 2 and "Traceback" not in err


def test_a_lora_adapter_export_loads_from_another_directory(tiny_lm, tmp_path, monkeypatch):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    shutil.copytree(tiny_lm, work / "models" / "tiny_lm")
    elsewhere.mkdir()
    monkeypatch.chdir(work)
    lora = {"r": 4, "target_modules": ["q_proj", "v_proj"], "save": "adapter"}
    policy = build_hf_policy(PolicyConfig(pretrained="models/tiny_lm", lora=lora), seed=0)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)  # a trained adapter: its output differs from the base's
    out = policy.save_pretrained(work / "hf_model", AutoTokenizer.from_pretrained("models/tiny_lm"))
    base = json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base == str(work / "models" / "tiny_lm")
    monkeypatch.chdir(elsewhere)
    loaded = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, policy(IDS)[0], atol=1e-5, rtol=1e-5)


def test_a_hub_id_without_network_fails_at_once_in_plain_words():
    # conftest sets HF_HUB_OFFLINE=1; the id is in no cache
    with pytest.raises(ValueError) as info:
        check_hf_policy(PolicyConfig(pretrained="no-such-org/no-such-model"))
    message = str(info.value)
    assert message.startswith("policy.pretrained: 'no-such-org/no-such-model' is not a local "
                              "directory, and this machine cannot download it: HF_HUB_OFFLINE is "
                              "set, and it is not in the hub cache"), message
    assert "cannot load no local" not in message


def test_an_unreachable_hub_is_found_out_without_retrying(tmp_path):
    """No HF_HUB_OFFLINE, and the hub's port closed: the probe's plain message, not the hub
    client's after its retries."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf_home"),
               PYTHONPATH=os.environ.get("PYTHONPATH", str(REPO)))
    code = ("from lightning_adv.trainer.policies.hf.loading import check_hub_reachable\n"
            "try:\n    check_hub_reachable('no-such-org/no-such-model', 'policy.pretrained')\n"
            "except ValueError as exc:\n    print(exc)\n")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                            timeout=120)
    assert "this machine cannot download it: there is no connection to 127.0.0.1:9" in result.stdout, (
        result.stdout + result.stderr)


def test_weights_files_get_the_mode_of_the_umask(tmp_path, tiny_lm):
    previous = os.umask(0o022)
    try:
        out = make_tiny(tmp_path / "tiny")
        policy = build_hf_policy(PolicyConfig(pretrained=tiny_lm, value_head=True), seed=0)
        saved = policy.save_pretrained(tmp_path / "hf_model", AutoTokenizer.from_pretrained(tiny_lm))
    finally:
        os.umask(previous)
    for path in (out / "model.safetensors", saved / "model.safetensors",
                 saved / "value_head.safetensors"):
        assert oct(path.stat().st_mode & 0o777) == oct(0o644), path
