"""The scripts of ``benchmarks/`` run end to end with tiny sizes and write their pages.
Speed itself is never asserted: only that every table and the page's header are there."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.peers import require_extra
from tests.support.scripts import shown_command

REPO = Path(__file__).resolve().parents[2]
HEADER_FIELDS = ("- Date: ", " UTC\n", "- Machine: ", " cores, ", "- Versions: ", "torch ",
                 "lightning ", "- Command: ", "- Commit: ", "OMP_WAIT_POLICY=PASSIVE")
DETERMINISM = "Nothing in these timings is deterministic"


def run_script(name: str, *args: str, page: Path | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, f"benchmarks/{name}.py", *args]
    if page is not None:
        command += ["--page", str(page)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)


def page_of(name: str, page: Path, *args: str) -> str:
    """Run a script and return its page, checked for the header every page has."""
    run = run_script(name, *args, page=page)
    assert run.returncode == 0, run.stderr[-3000:]
    text = page.read_text()
    assert text.startswith("# ")
    for field in HEADER_FIELDS:
        assert field in text, field
    assert shown_command(f"benchmarks/{name}.py", list(args)) in text  # as typed
    assert text.rstrip().endswith("ratios between cases measured side by side in one run; "
                                  "compare absolute times only between runs on the same idle "
                                  "machine.") and DETERMINISM in text
    return text


def git_head() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")


def test_advantage_times_kernels_loops_and_modules_at_each_thread_count(tmp_path):
    text = page_of("advantage", tmp_path / "advantage.md", "--sizes", "8x32,3x16", "--repeats",
                   "1", "--device", "cpu", "--threads", "1", "2", "--configs", "default",
                   "ppo.yaml", "turn_gae.yaml")
    assert "## cpu, 1 thread\n" in text and "## cpu, 2 threads\n" in text
    for column in ("clone token inputs", "token γ=1 λ=0.95 ÷ clone", "turn γ=1 λ=0.95",
                   "token γ=1 λ per row", "token loop ÷ kernel", "turn per-row loop",
                   "÷ its kernel call", "Time with more threads ÷ time with 1"):
        assert column in text, column
    for size in ("8×32", "3×16"):
        assert re.search(rf"^\| {size} \| \d", text, re.M)
        assert f"| {size} | ppo.yaml | " in text and "(turn γ=1 λ=0.95)" in text
        assert re.search(rf"^\| {size} \| 2 \| ", text, re.M)  # the threads table


def test_advantage_rejects_bad_arguments_by_name():
    run = run_script("advantage", "--sizes", "64by2048")
    assert run.returncode == 2 and "--sizes" in run.stderr and "64by2048" in run.stderr
    run = run_script("advantage", "--configs", "nope.yaml")
    assert run.returncode == 2 and "--configs: unknown nope.yaml" in run.stderr
    run = run_script("advantage", "--threads", "2", "0")  # refused before torch loads
    assert run.returncode == 1 and "--threads: expected counts of at least 1, got 2 0" in run.stderr


def test_trainer_step_compares_with_a_commit_in_separate_processes(tmp_path):
    head = git_head()
    text = page_of("trainer_step", tmp_path / "trainer.md", "--configs", "ppo", "--steps", "1",
                   "--warmup", "1", "--repeats", "1", "--baseline", head, "--no-build")
    assert f"Baseline {head} = {head}" in text
    assert re.search(r"^\| ppo \| [\d.]+ \| [\d.]+ \| [\d.]+ \| ", text, re.M)
    assert "### ppo: milliseconds per step" in text
    for phase in ("sampling", "scoring", "advantages", "update", "logging", "step"):
        assert re.search(rf"^\| {phase} \| [\d.]+ \| [\d.]+ \| \d+% \|$", text, re.M), phase


def test_trainer_step_names_a_config_missing_from_a_tree():
    run = run_script("trainer_step", "--configs", "nope", "--baseline", git_head())
    assert run.returncode == 2
    assert "--configs: nope not in the baseline tree's configs/" in run.stderr


@pytest.mark.slow
def test_trainer_step_trains_the_hf_config_on_the_tiny_model(tmp_path):
    """The Hugging Face config needs the tiny model, made by the tree's own command."""
    text = page_of("trainer_step", tmp_path / "trainer.md", "--configs", "hf_grpo", "--steps",
                   "1", "--warmup", "0", "--repeats", "1", "--baseline", git_head(), "--no-build")
    assert re.search(r"^\| hf_grpo \| [\d.]+ \| [\d.]+ \| ", text, re.M)
    assert "Hugging Face model of the hf_* configs: the tiny model of the candidate" in text
    assert not (REPO / "hf_model").exists()  # the run saved its policy in its own directory


def test_hf_sampling_reports_cache_and_no_cache_side_by_side(tiny_lm, tmp_path):
    text = page_of("hf_sampling", tmp_path / "hf.md", "--model", tiny_lm, "--batch", "2",
                   "--new-tokens", "4", "--repeats", "1")
    for variant in ("trainer sampler", "transformers generate"):
        row = re.search(rf"^\| {variant} \| 4 \| 1 \| (\d+) \| (\d+) \| ([\d.]+)× \|$", text, re.M)
        assert row and all(float(v) > 0 for v in row.groups()), variant


def test_memory_measures_each_phase_in_its_own_process(tmp_path):
    text = page_of("memory", tmp_path / "memory.md", "--vocab", "600", "--hidden", "16",
                   "--batch", "4", "--seq", "24", "--dtypes", "float32", "--sizes", "1",
                   "--phases", "scoring", "update", "--baseline", "")
    rows = re.findall(r"^\| (scoring|update) \| this checkout \| float32 \| 1 \| (-?\d+) \| "
                      r"([\d.]+) \|$", text, re.M)
    assert [r[0] for r in rows] == ["scoring", "update"]
    assert "one float32 copy of the logits is 0 MiB" in text
    assert "The peaks depend on the code, the model and the sizes only" in text


def test_memory_peak_is_the_call_own_not_an_earlier_peak():
    """An earlier, larger peak of the process (here 300 MiB held and freed; in the
    benchmark the parent's, which a child started by fork and exec inherits in
    ``ru_maxrss``) does not count: a call holding nothing reads near 0, one holding
    200 MiB near 200."""
    code = textwrap.dedent("""
        from memory import peak_mib
        held = b"\\x01" * (300 * 2**20)  # written, so resident
        del held
        size, held = peak_mib(lambda: len(b"\\x01" * (200 * 2**20)))
        print(peak_mib(lambda: None)[1], size, held)
        """)
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO / "benchmarks",
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    idle, size, held = map(float, run.stdout.split())
    assert idle < 40 and size == 200 * 2**20 and 190 <= held <= 240


def test_vs_trl_rejects_bad_arguments_by_name():
    run = run_script("vs_trl", "--samples", "1")
    assert run.returncode == 2 and "--samples: GRPO needs at least 2" in run.stderr
    run = run_script("vs_trl", "--prompts-per-step", "3", "--samples", "3", "--minibatches", "2")
    assert run.returncode == 2 and "--minibatches must divide" in run.stderr
    run = run_script("vs_trl", "--log-every", "0")
    assert run.returncode == 2 and "--log-every must be at least 1" in run.stderr


@pytest.mark.slow
def test_vs_trl_trains_both_trainers_and_writes_the_table(tmp_path):
    """Two steps of each trainer (TRL's released GRPOTrainer) on the tiny model."""
    require_extra("trl")
    text = page_of("vs_trl", tmp_path / "vs_trl.md", "--steps", "2", "--seeds", "0",
                   "--prompts-per-step", "2", "--samples", "2", "--every-step-too")
    for name in ("lightning_adv fit", "TRL GRPOTrainer", "lightning_adv fit, logging every step"):
        assert re.search(rf"^\| {name} \| [\d.]+ ± [\d.]+ \| \d+ ± \d+ \| \d+ ± \d+ \| \d+ ± ",
                         text, re.M), name
    assert re.search(r"^\| 0 \| \d+ \| \d+ \| [\d.]+× \| [\d.]+× \| [\d.]+ / [\d.]+ \|$", text, re.M)
    assert re.search(r"^\| tokens/s ratio \(ours ÷ TRL\) \| [\d.]+ ± 0\.00 \| ", text, re.M)
    assert re.search(r"^\| held-out reward, greedy \(ours − TRL\) \| [+-][\d.]+ ± 0\.000 \| ",
                     text, re.M)
    assert "| tokens/s ratio, ours logging every step ÷ TRL |" in text
    assert "| distinct greedy responses (of 200) |" in text
    assert "TRL 1.16.0 (GRPOTrainer)" in text and "every 10 training steps" in text
    assert not (REPO / "hf_model").exists()


def test_prompt_sharing_refuses_a_config_without_a_pretrained_policy():
    run = run_script("prompt_sharing", "--config", "configs/ppo.yaml")
    assert run.returncode == 2 and "no model.policy.pretrained" in run.stderr


@pytest.mark.slow
def test_prompt_sharing_times_both_sides_in_one_process(tmp_path):
    text = page_of("prompt_sharing", tmp_path / "ps.md", "--steps", "1", "--warmup", "0",
                   "--repeats", "1")
    for phase in ("sampling", "scoring", "update", "total"):
        assert re.search(rf"^\| {phase} \| [\d.]+ \| [\d.]+ \| [\d.]+× \|$", text, re.M), phase
    assert not (REPO / "hf_model").exists()


def test_shared_prefix_times_the_three_sides_of_the_update(tmp_path):
    text = page_of("shared_prefix", tmp_path / "sp.md", "--prompts", "1", "--prompt", "8",
                   "--tree", "1x16", "2x40", "2x4", "--hidden", "32", "--layers", "1",
                   "--repeats", "1")
    assert "- Rows: 1 tree(s) of 4 rows, " in text and " in 3 model calls" in text
    for side in ("whole rows", "each prompt once", "each shared prefix once"):
        assert re.search(rf"^\| {side} \| [\d.]+ \| [\d.]+× \| [\d.]+× \|$", text, re.M), side


def test_shared_prefix_refuses_a_bad_tree():
    run = run_script("shared_prefix", "--tree", "2x")
    assert run.returncode == 2 and "expected NxL (branches x tokens), got '2x'" in run.stderr
