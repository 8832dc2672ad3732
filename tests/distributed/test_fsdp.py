"""FSDP2 (``--trainer.strategy=fsdp2``) against DDP, end to end, on two CPU processes (gloo).

One run of ``configs/hf_grpo_fsdp.yaml`` under FSDP2 and the same run under DDP (same
seeds): every step's rewards and advantages (on both ranks), every logged loss and
metric and the final weights are equal to float tolerance; the policy and the frozen
reference are held as shards; a sharded checkpoint resumes into the same next steps;
``hf_model/`` holds the full weights, which ``AutoModelForCausalLM`` loads and which
generate the tokens the sharded policy generated. The GPU variant is marked ``cuda``."""

import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.support.cli_runs import scalars
from tests.support.fsdp_probe import two_process_fit

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "hf_grpo_fsdp.yaml"
STEPS = 5
RESUME_AFTER = 3
#: a reward that differs between random responses, so every step has advantages to compare
SMALL = [f"--model.task.dataset={REPO / 'data' / 'reverse_text.jsonl'}",
         "--model.task.reward=tests.support.trainer_helpers.response_length_reward",
         f"--trainer.limit_train_batches={STEPS}", "--trainer.max_epochs=1",
         "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
         "--model.ppo.prompts_per_step=4", "--model.ppo.n_samples=4",
         "--model.ppo.minibatches=2", "--model.ppo.max_new_tokens=8",
         "--model.evaluation.num_prompts=0"]
RUN = Path("hf_grpo_fsdp") / "version_0"


def every_step_checkpoints(tmp: Path) -> Path:
    """The shipped config, with a checkpoint after every training step."""
    config = yaml.safe_load(CONFIG.read_text())
    (callback,) = config["trainer"]["callbacks"]
    callback["init_args"]["every_n_train_steps"] = 1
    path = tmp / "hf_grpo_fsdp.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def fit_or_fail(*args, **kwargs):
    proc = two_process_fit(*args, **kwargs)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def fsdp_and_ddp_runs(tmp: Path, tiny_lm: str, accelerator: str = "cpu") -> dict:
    """The run under DDP, the run under FSDP2 and the FSDP2 run resumed from its
    checkpoint after step ``RESUME_AFTER``."""
    config = every_step_checkpoints(tmp)
    model = f"--model.policy.pretrained={tiny_lm}"
    out = {}
    for strategy in ("ddp", "fsdp2"):
        (tmp / strategy).mkdir()
        fit_or_fail(config, tmp / strategy, tmp / f"record_{strategy}", strategy, model, *SMALL,
                    accelerator=accelerator)
        out[strategy] = tmp / strategy / RUN
    # the uninterrupted run's export, kept apart from the resumed run's
    shutil.copytree(out["fsdp2"] / "hf_model", tmp / "uninterrupted_hf_model")
    ckpt = out["fsdp2"] / "checkpoints" / f"epoch=0-step={RESUME_AFTER}.ckpt"
    fit_or_fail(config, tmp / "fsdp2", tmp / "record_resumed", "fsdp2", model, *SMALL,
                f"--ckpt_path={ckpt}", accelerator=accelerator)
    # a resumed run writes a run directory of its own beside its parent's
    resumed = out["fsdp2"].parent / "version_1"
    assert (resumed / "hf_model").is_dir(), sorted(p.name for p in out["fsdp2"].parent.iterdir())
    return {"tmp": tmp, "ckpt": ckpt, "resumed": resumed, **out}


@pytest.fixture(scope="module")
def runs(tiny_lm, tmp_path_factory):
    return fsdp_and_ddp_runs(tmp_path_factory.mktemp("fsdp"), tiny_lm)


def recorded(tmp: Path, name: str, rank: int, call: int) -> dict:
    return torch.load(tmp / f"record_{name}" / f"rank{rank}_call{call}.pt", weights_only=False)


def assert_same_steps(tmp, left, right, steps, offset=0):
    for step in steps:
        for rank in (0, 1):
            a = recorded(tmp, left, rank, step)
            b = recorded(tmp, right, rank, step - offset)
            assert a.keys() == b.keys()
            for key in a:
                torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6,
                                           msg=f"{key}, step {step}, rank {rank}")


def test_fsdp2_trains_as_ddp_step_by_step(runs):
    assert_fsdp2_trains_as_ddp(runs)


def assert_fsdp2_trains_as_ddp(runs):
    tmp = runs["tmp"]
    assert_same_steps(tmp, "fsdp2", "ddp", range(STEPS))
    # the comparison has teeth: rewards and advantages differ between responses and steps
    first, last = recorded(tmp, "ddp", 0, 0), recorded(tmp, "ddp", 0, STEPS - 1)
    assert first["advantages"].abs().sum() > 0 and first["rewards"].std() > 0
    assert not torch.equal(first["rewards"], last["rewards"])
    fsdp, ddp = scalars(runs["fsdp2"]), scalars(runs["ddp"])
    for tag in ("train/policy_loss", "train/kl_loss", "train/entropy", "train/task_reward",
                "train/advantages_mean", "train/approx_kl", "train/clipfrac"):
        assert sorted(fsdp[tag]) == list(range(STEPS)), tag
        for step, value in ddp[tag].items():
            assert fsdp[tag][step] == pytest.approx(value, rel=1e-5, abs=1e-6), (tag, step)
    assert set(fsdp) == set(ddp)
    sharded = load_file(runs["fsdp2"] / "hf_model" / "model.safetensors")
    replicated = load_file(runs["ddp"] / "hf_model" / "model.safetensors")
    assert sharded.keys() == replicated.keys()
    for name, weight in replicated.items():
        torch.testing.assert_close(sharded[name], weight, rtol=1e-5, atol=1e-6, msg=name)


def test_policy_and_reference_are_sharded_over_both_ranks(runs):
    for rank in (0, 1):
        held = torch.load(runs["tmp"] / "record_fsdp2" / f"rank{rank}_weights.pt")
        weights = {k: v for k, v in held.items() if k.startswith(("policy.", "ref_policy."))}
        assert any(k.startswith("ref_policy.model.model.layers.") for k in weights)
        for name, how in weights.items():
            assert how["sharded"] and how["ranks"] == 2, name
            assert how["placements"] == ["Shard(0)"], name
            rows = how["shape"][0]
            assert how["local"][0] == ((rows + 1) // 2 if rank == 0 else rows // 2), name
    ddp = torch.load(runs["tmp"] / "record_ddp" / "rank0_weights.pt")
    assert not any(how["sharded"] for how in ddp.values())


def test_a_sharded_checkpoint_resumes_into_the_same_next_steps(runs):
    ckpt = runs["ckpt"]
    assert ckpt.is_dir()
    assert {p.name for p in ckpt.iterdir()} >= {"__0_0.distcp", "__1_0.distcp", "meta.pt",
                                                 ".metadata"}
    assert_same_steps(runs["tmp"], "fsdp2", "resumed", range(RESUME_AFTER, STEPS),
                      offset=RESUME_AFTER)
    resumed = load_file(runs["resumed"] / "hf_model" / "model.safetensors")
    uninterrupted = load_file(runs["tmp"] / "uninterrupted_hf_model" / "model.safetensors")
    for name, weight in uninterrupted.items():
        torch.testing.assert_close(resumed[name], weight, rtol=1e-5, atol=1e-6, msg=name)


def test_hf_model_holds_the_full_weights_and_generates_the_sharded_policys_tokens(runs, tiny_lm):
    out = runs["tmp"] / "uninterrupted_hf_model"
    model = AutoModelForCausalLM.from_pretrained(out)
    initial = AutoModelForCausalLM.from_pretrained(tiny_lm)
    full = dict(model.named_parameters())
    for name, weight in initial.named_parameters():  # every weight whole, and trained
        assert full[name].shape == weight.shape, name
    assert not torch.equal(full["lm_head.weight"], initial.lm_head.weight)
    for rank in (0, 1):
        for record in torch.load(runs["tmp"] / "record_fsdp2" / f"rank{rank}_greedy.pt"):
            prompt = torch.tensor([record["prompt"]])
            response = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                      max_new_tokens=len(record["response"]), do_sample=False,
                                      top_k=None, top_p=None)[0, prompt.shape[1]:]
            assert response.tolist() == record["response"], rank


@pytest.mark.cuda
def test_fsdp2_trains_as_ddp_on_two_gpus(tiny_lm, tmp_path):
    """The same comparison on two GPUs (nccl)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    runs = fsdp_and_ddp_runs(tmp_path, tiny_lm, accelerator="gpu")
    assert_fsdp2_trains_as_ddp(runs)
    test_a_sharded_checkpoint_resumes_into_the_same_next_steps(runs)


@pytest.mark.slow
@pytest.mark.parametrize("config, extra", [
    ("hf_ppo", []),  # a value head on the shared trunk, the reward-side KL penalty
    ("hf_grpo_fsdp", ["--model.policy.lora.r=4",  # LoRA: the reference is the adapter-free policy
                      "--model.policy.lora.target_modules=[q_proj, v_proj]"]),
])
def test_fsdp2_trains_as_ddp_for_twenty_steps(config, extra, tiny_lm, tmp_path):
    steps = 20
    args = [f"--model.policy.pretrained={tiny_lm}", *SMALL,
            f"--trainer.limit_train_batches={steps}", *extra]
    runs = {}
    for strategy in ("ddp", "fsdp2"):
        (tmp_path / strategy).mkdir()
        fit_or_fail(REPO / "configs" / f"{config}.yaml", tmp_path / strategy,
                    tmp_path / f"record_{strategy}", strategy, *args)
        runs[strategy] = tmp_path / strategy / config / "version_0" / "hf_model"
    assert_same_steps(tmp_path, "fsdp2", "ddp", range(steps))
    for name in ("model.safetensors", "value_head.safetensors"):
        if (runs["ddp"] / name).exists() or name == "model.safetensors":
            sharded, replicated = (load_file(runs[s] / name) for s in ("fsdp2", "ddp"))
            for key, weight in replicated.items():
                torch.testing.assert_close(sharded[key], weight, rtol=1e-5, atol=1e-6, msg=key)
