"""The trainer with a Hugging Face policy: the first PPO step's ratio is 1, the shipped HF
configs run through the CLI, the policy is saved for inference, bf16-mixed on CPU, DDP on
CPU gives the advantages of one process on the global batch, LoRA, errors before training."""

import re
import shutil
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_adv import ActorConfig, AdvantageModule
from lightning_adv.cli import main
from lightning_adv.batch.grouping import concat_batch
from lightning_adv.trainer import PPOConfig, PPOModule, PolicyConfig, TaskConfig
from tests.support.cli_runs import SMALL, scalars
from tests.support.trainer_helpers import ddp_fit

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
DATASET = str(REPO / "data" / "reverse_text.jsonl")
CHAR_MATCH = "lightning_adv.trainer.tasks.text.char_match"
HF_CONFIGS = ["hf_grpo", "hf_ppo"]


def hf_fit(config, save_dir, model_dir, *extra):
    main(["fit", "--config", str(CONFIGS / f"{config}.yaml"),
          f"--trainer.logger.init_args.save_dir={save_dir}", f"--model.policy.pretrained={model_dir}",
          f"--model.task.dataset={DATASET}", "--trainer.max_epochs=1", *SMALL, *extra])


def loss_inputs(module):
    """Record (logprobs, old logprobs, loss mask) of every loss call."""
    calls = []
    forward = module.loss_fn.forward

    def recording(logprobs, old_logprobs, advantages, mask, **kwargs):
        calls.append((logprobs.detach().clone(), old_logprobs.clone(), mask.clone()))
        return forward(logprobs, old_logprobs, advantages, mask, **kwargs)

    module.loss_fn.forward = recording
    return calls


@pytest.mark.parametrize("policy, actor", [
    ({"value_head": False}, {"kl_ctl": 0.0}),
    ({"value_head": True}, {"kl_ctl": 0.05}),
    ({"value_head": True, "lora": {"r": 4, "target_modules": ["q_proj", "v_proj"]}},
     {"kl_ctl": 0.05}),
])
def test_first_ppo_step_ratio_is_one(tiny_lm, tmp_path, policy, actor):
    module = PPOModule(policy=PolicyConfig(pretrained=tiny_lm, **policy),
                       actor=ActorConfig(**actor),
                       task=TaskConfig(dataset=DATASET, reward=CHAR_MATCH),
                       ppo=PPOConfig(prompts_per_step=4, n_samples=4, minibatches=2, epochs=1,
                                     lr=0.01, max_new_tokens=6, entropy_coef=0.01), seed=0)
    calls = loss_inputs(module)
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module)
    (new, old, mask), (later_new, later_old, later_mask) = calls
    ratio = (new - old).exp()[mask > 0]
    assert ratio.numel() > 10
    assert (ratio - 1).abs().max() < 1e-5  # same weights, same log-probs, float32
    # the second minibatch comes after an optimizer step (the entropy bonus always has a
    # gradient): its ratio moved
    assert ((later_new - later_old).exp()[later_mask > 0] - 1).abs().max() > 1e-3


@pytest.mark.parametrize("config", HF_CONFIGS)
def test_shipped_hf_configs_fit_and_save_a_loadable_model(config, tiny_lm, tmp_path):
    shipped = yaml.safe_load((CONFIGS / f"{config}.yaml").read_text())
    assert shipped["model"]["policy"]["pretrained"] == "models/tiny_lm"
    hf_fit(config, tmp_path, tiny_lm)
    log_dir = tmp_path / config / "version_0"
    logged = scalars(log_dir)
    for tag in ("train/task_reward", "train/advantages_mean", "train/policy_loss",
                "train/response_length", "train/entropy"):
        assert sorted(logged[tag]) == [0, 1], tag
    critic = shipped["model"]["policy"]["value_head"]
    assert ("train/value_loss" in logged) == critic
    assert (logged["train/kl_rewards"][1] != 0) == (shipped["model"]["actor"]["kl_ctl"] > 0)
    out = log_dir / "hf_model"
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert (out / "value_head.safetensors").is_file() == critic
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Reverse: abc"}],
                                        add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)
    generated = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] > ids["input_ids"].shape[1]
    # the saved weights are the trained ones, not the initial ones
    initial = AutoModelForCausalLM.from_pretrained(tiny_lm)
    assert not torch.equal(initial.lm_head.weight, model.lm_head.weight)


def test_hf_model_is_saved_with_every_checkpoint(tiny_lm, tmp_path):
    module = PPOModule(policy=PolicyConfig(pretrained=tiny_lm, value_head=False),
                       actor=ActorConfig(kl_ctl=0.0),
                       task=TaskConfig(dataset=DATASET, reward=CHAR_MATCH),
                       ppo=PPOConfig(prompts_per_step=2, n_samples=2, minibatches=1, epochs=1,
                                     max_new_tokens=4, entropy_coef=0.01), seed=0)
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=2, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path,
                         logger=pl.loggers.TensorBoardLogger(tmp_path, name="run"),
                         callbacks=[pl.callbacks.ModelCheckpoint(every_n_train_steps=1,
                                                                 save_top_k=-1)])
    trainer.fit(module)
    out = tmp_path / "run" / "version_0" / "hf_model"
    assert module.hf_model_dir == str(out)
    saved = torch.load(tmp_path / "run" / "version_0" / "checkpoints" / "epoch=0-step=2.ckpt",
                       weights_only=False)["state_dict"]
    model = AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(model.lm_head.weight, saved["policy.model.lm_head.weight"])
    shutil.rmtree(out)
    trainer.save_checkpoint(tmp_path / "manual.ckpt")  # a checkpoint writes hf_model/ again
    assert AutoModelForCausalLM.from_pretrained(out).config.model_type == "qwen2"


def test_resume_reproduces_the_next_steps_exactly(tiny_lm, tmp_path, monkeypatch):
    """The HF policy, its value head and the reference copy come back from a checkpoint,
    and sampling is seeded by (seed, step, rank): a resumed run repeats the full run."""
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    full.mkdir(), resumed.mkdir()
    common = ["--trainer.limit_train_batches=4", "--trainer.callbacks.every_n_train_steps=2",
              "--model.advantage_module=tests.support.trainer_helpers.RecordingAdvantageModule"]
    monkeypatch.setenv("LIGHTNING_ADV_RECORD", str(full))
    hf_fit("hf_ppo", tmp_path, tiny_lm, *common)
    first = scalars(tmp_path / "hf_ppo" / "version_0")
    ckpt = tmp_path / "hf_ppo" / "version_0" / "checkpoints" / "epoch=0-step=2.ckpt"
    monkeypatch.setenv("LIGHTNING_ADV_RECORD", str(resumed))
    hf_fit("hf_ppo", tmp_path, tiny_lm, *common, f"--ckpt_path={ckpt}")
    for resumed_call, full_call in ((0, 2), (1, 3)):  # the resumed run starts at step 2
        a = torch.load(full / f"rank0_call{full_call}.pt", weights_only=True)
        b = torch.load(resumed / f"rank0_call{resumed_call}.pt", weights_only=True)
        for key in a:
            assert torch.equal(a[key], b[key]), (key, full_call)
    # Steps 2 and 3 of the first run exist: the resumed run writes its own version_1
    # (the first is left as it was), and logs the first run's steps 2 and 3 again.
    assert scalars(tmp_path / "hf_ppo" / "version_0") == first
    after = scalars(tmp_path / "hf_ppo" / "version_1")
    for tag in ("train/policy_loss", "train/value_loss", "train/kl_rewards"):
        assert after[tag] == {s: first[tag][s] for s in (2, 3)}, tag


def test_bf16_mixed_precision_and_bf16_weights_on_cpu(tiny_lm, tmp_path):
    hf_fit("hf_ppo", tmp_path, tiny_lm, "--trainer.precision=bf16-mixed")
    logged = scalars(tmp_path / "hf_ppo" / "version_0")
    assert sorted(logged["train/policy_loss"]) == [0, 1]
    assert all(v == v for v in logged["train/value_loss"].values())  # finite, not NaN
    hf_fit("hf_ppo", tmp_path, tiny_lm, "--model.policy.dtype=bfloat16")
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "hf_ppo" / "version_1" / "hf_model")
    assert saved.dtype == torch.bfloat16


def test_lora_through_the_cli_saves_an_adapter(tiny_lm, tmp_path):
    hf_fit("hf_ppo", tmp_path, tiny_lm, "--model.policy.lora.r=4",
           "--model.policy.lora.target_modules=[q_proj, v_proj]", "--model.policy.lora.save=adapter")
    out = tmp_path / "hf_ppo" / "version_0" / "hf_model"
    assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
    assert AutoModelForCausalLM.from_pretrained(out) is not None
    saved = yaml.safe_load((tmp_path / "hf_ppo" / "version_0" / "config.yaml").read_text())
    assert saved["model"]["policy"]["lora"]["r"] == 4


def test_ddp_gives_the_advantages_of_one_process_on_the_global_batch(tiny_lm, tmp_path):
    record = tmp_path / "record"
    record.mkdir()
    proc = ddp_fit(CONFIGS / "hf_ppo.yaml", tmp_path, record, f"--model.policy.pretrained={tiny_lm}",
                   f"--model.task.dataset={DATASET}", "--trainer.max_epochs=1", *SMALL,
                   recorder="BatchRecordingAdvantageModule")
    assert proc.returncode == 0, proc.stderr[-3000:]
    actor = yaml.safe_load((CONFIGS / "hf_ppo.yaml").read_text())["model"]["actor"]
    module = AdvantageModule(ActorConfig(**actor))
    for step in (0, 1):
        ranks = [torch.load(record / f"rank{r}_call{step}.pt", weights_only=False) for r in (0, 1)]
        assert [len(r["inputs"]) for r in ranks] == [2, 2]  # two whole prompt groups each
        batch, meta = concat_batch(ranks[0]["inputs"] + ranks[1]["inputs"])
        single = module(batch, meta)
        rows = 0
        for r in ranks:
            n, width = r["advantages"].shape
            torch.testing.assert_close(single["advantages"][rows: rows + n, :width],
                                       r["advantages"], atol=1e-5, rtol=1e-5)
            rows += n
        # batch whitening over one rank's rows alone would differ: the check has teeth
        alone = module(*concat_batch(ranks[0]["inputs"]))
        assert not torch.allclose(alone["advantages"], ranks[0]["advantages"], rtol=1e-2,
                                  atol=1e-7)
    assert (tmp_path / "hf_ppo" / "version_0" / "hf_model" / "model.safetensors").is_file()


@pytest.mark.parametrize("config, override, code, message", [
    ("hf_grpo", "--model.policy.pretrained=./no/such/dir", 2, "model.policy.pretrained: no such"),
    ("hf_grpo", "--model.policy.pretrained=BROKEN", 2,
     r"model.policy.pretrained: cannot load the model config of '.*broken': .*; expected a "
     r"Hugging Face model directory .*config.json.* python -m lightning_adv make-tiny"),
    ("hf_grpo", "--model.policy.dtype=float16", 2, "model.policy.dtype: float16 needs a GPU"),
    ("hf_grpo", "--model.task.dataset=BAD", 2, "model.task.dataset: line 2 of .* has no 'prompt'"),
    ("hf_ppo", "--model.policy.critic_pretrained=./nowhere", 2,
     "model.policy.critic_pretrained: no such directory"),
    ("hf_grpo", "--model.policy.lora.r=0", 2, "model.policy.lora.r: expected a positive integer"),
    # found while building the prompts, before training: exit 1 as any bad prompt
    ("hf_grpo", "--model.ppo.max_new_tokens=600", 1, "exceed the model's context window of 512"),
    ("hf_grpo", "--model.task.dataset=LONG", 1, "task.dataset .*: prompt of instance 1: 6.. prompt "
                                                "tokens .* exceed the model's context window of 512"),
])
def test_bad_hf_input_stops_before_training_naming_the_key(config, override, code, message,
                                                            tiny_lm, tmp_path, capsys):
    if "BAD" in override:
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"prompt": "Reverse: ab", "answer": "ba"}\n{"answer": "x"}\n')
        override = override.replace("BAD", str(bad))
    if "LONG" in override:
        long = tmp_path / "long.jsonl"
        long.write_text('{"prompt": "ab", "answer": "ba"}\n{"prompt": "%s", "answer": "x"}\n'
                        % ("a" * 600) + '{"prompt": "ab", "answer": "ba"}\n' * 20)  # 16 held out
        override = override.replace("LONG", str(long))
    if "BROKEN" in override:  # a model directory whose config.json is not JSON
        broken = tmp_path / "broken"
        shutil.copytree(tiny_lm, broken)
        (broken / "config.json").write_text("{not json")
        override = override.replace("BROKEN", str(broken))
    if "float16" in override and torch.cuda.is_available():
        pytest.skip("float16 is fine on a GPU")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(CONFIGS / f"{config}.yaml"),
              f"--model.policy.pretrained={tiny_lm}",
              f"--trainer.logger.init_args.save_dir={tmp_path}", *SMALL, override])
    assert exit_info.value.code == code
    err = capsys.readouterr().err
    assert re.search(message, err), err[-2000:]
    assert not (tmp_path / config).exists()  # nothing was trained or logged


def test_top_k_top_p_and_stop_strings_need_a_hf_policy():
    with pytest.raises(ValueError, match="ppo.top_k: supported with a Hugging Face policy"):
        PPOModule(ppo=PPOConfig(top_k=5))
    with pytest.raises(ValueError, match="ppo.top_p: supported with a Hugging Face policy"):
        PPOModule(ppo=PPOConfig(top_p=0.9))
    with pytest.raises(ValueError, match="task.stop_strings: supported with a Hugging Face"):
        PPOModule(task=TaskConfig(stop_strings=["="]))


def test_greedy_baseline_and_dynamic_sampling_with_a_hf_policy(tiny_lm, tmp_path):
    from lightning_adv.recipes import recipe
    from transformers import GenerationConfig

    module = PPOModule(policy=PolicyConfig(pretrained=tiny_lm, value_head=False),
                       actor=recipe("remax"), task=TaskConfig(dataset=DATASET, reward=CHAR_MATCH),
                       ppo=PPOConfig(prompts_per_step=2, n_samples=4, minibatches=2, epochs=1,
                                     max_new_tokens=5, greedy_baseline=True,
                                     dynamic_sampling={"enabled": True, "max_rounds": 2}), seed=0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.policy.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    indices = [3, 7]
    baselines = module.rollouts.greedy_rewards(indices)
    tokenizer = module.policy.tokenizer
    for index, baseline in zip(indices, baselines):
        prompt = torch.tensor([module.runtime.instance(index)[1]])
        out = module.policy.model.generate(prompt, generation_config=GenerationConfig(
            do_sample=False, max_new_tokens=5, eos_token_id=tokenizer.eos_token_id))
        response = tokenizer.decode(out[0, prompt.shape[1]:], skip_special_tokens=True)
        answer = module.runtime.task.instance_at(index)["answer"]
        assert baseline == pytest.approx(char_match_text(response, answer))
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module)
    assert module.rollout_step == 1


def char_match_text(response, answer):
    from lightning_adv.trainer.tasks.runtime import Sample, Turn
    from lightning_adv.trainer.tasks.text import char_match

    return char_match(Sample(0, {"answer": answer}, "", (Turn(response, (), True),), False))


