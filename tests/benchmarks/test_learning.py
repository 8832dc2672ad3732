"""benchmarks/learning.py trains shipped configs as the README's first command does and
writes the learning page (two short runs here; the page's numbers are never asserted)."""

import re
import subprocess
import sys
from pathlib import Path
from tests.support.scripts import shown_command

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--trainer.limit_train_batches=3", "--trainer.max_epochs=1",
         "--model.ppo.prompts_per_step=4", "--model.ppo.n_samples=2", "--model.ppo.minibatches=2"]


def test_learning_page_has_the_table_the_machine_and_the_command(tmp_path):
    page, plot = tmp_path / "learning.md", tmp_path / "curves.png"
    args = ["--configs", "ppo", "hf_grpo", "--window", "2", "--plot", str(plot),
            *[f"--override={a}" for a in SMALL]]
    run = subprocess.run([sys.executable, "benchmarks/learning.py", *args, "--page", str(page)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    text = page.read_text()
    for field in ("# Learning", "- Date: ", " UTC\n", "- Machine: ", " cores, ", "- Versions: ",
                  "- Command: ", "- Commit: ", "The rewards are deterministic on one machine",
                  "Nothing in these timings is deterministic"):
        assert field in text, field
    assert shown_command("benchmarks/learning.py", list(args)) in text  # as typed
    for name in ("ppo", "hf_grpo"):  # hf_grpo trains the tiny model the script makes first
        row = re.search(rf"^\| {name}\.yaml \| ([\d.]+) \| .* \| (\d+) \| \d+m \d\ds \|$", text,
                        re.M)
        assert row and int(row.group(2)) > 0, name
    assert "`fit --config configs/ppo.yaml`: " in text
    assert "![reward curves](curves.png)" in text and plot.stat().st_size > 0


def test_learning_names_a_missing_config():
    run = subprocess.run([sys.executable, "benchmarks/learning.py", "--configs", "nope"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--configs: no configs/<name>.yaml for nope" in run.stderr


def test_learning_over_seeds_gives_median_and_range(tmp_path):
    page, plot = tmp_path / "seeds.md", tmp_path / "seeds.png"
    args = ["--configs", "ppo", "--seeds", "1", "2", "--window", "2", "--plot", str(plot),
            *[f"--override={a}" for a in SMALL]]
    run = subprocess.run([sys.executable, "benchmarks/learning.py", *args, "--page", str(page)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    text = page.read_text()
    for seed in (1, 2):
        assert f"`fit --config configs/ppo.yaml --seed_everything={seed}`: " in text
    cell = r"([\d.]+) \[([\d.]+)-([\d.]+)\]"
    row = re.search(rf"^\| ppo\.yaml \| {cell} \| {cell} \| {cell} \| 3 \|$", text, re.M)
    assert row, text
    values = [float(v) for v in row.groups()]
    for median, low, high in (values[0:3], values[3:6], values[6:9]):
        assert low <= median <= high
    assert values[1] < values[2], "the seeds' runs differ (each ran at its own seed)"
    assert plot.stat().st_size > 0


def test_tiny_hf_trains_the_config_with_the_tiny_model_beside_the_built_in_policy(tmp_path):
    page = tmp_path / "policy-choice.md"
    args = ["--configs", "ppo", "--tiny-hf", "--window", "2",
            *[f"--override={a}" for a in SMALL]]
    run = subprocess.run([sys.executable, "benchmarks/learning.py", *args, "--page", str(page)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    text = page.read_text()
    for label in ("ppo.yaml", "ppo.yaml, tiny HF policy"):
        assert re.search(rf"^\| {re.escape(label)} \| [\d.]+ \| .* \| 3 \| \d+m \d\ds \|$", text,
                         re.M), label
    assert "`fit --config configs/ppo.yaml --model.policy.pretrained=<tiny model>`: " in text
