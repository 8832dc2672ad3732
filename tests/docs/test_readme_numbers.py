"""The script that regenerates the README's numbers runs end to end (two short runs)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_numbers_script_writes_the_table(tmp_path):
    out = tmp_path / "learning.md"
    small = ["--trainer.limit_train_batches=3", "--trainer.max_epochs=1",
             "--model.ppo.prompts_per_step=4", "--model.ppo.n_samples=2",
             "--model.ppo.minibatches=2"]
    subprocess.run([sys.executable, "scripts/readme_numbers.py", "--configs", "ppo", "hf_grpo",
                    "--window",
                    "2", "--out", str(out), "--plot", str(tmp_path / "curves.png"),
                    *[f"--override={a}" for a in small]], cwd=ROOT, check=True, timeout=300)
    text = out.read_text()
    for name in ("ppo", "hf_grpo"):  # hf_grpo trains the tiny model the script makes first
        row = next(line for line in text.splitlines() if line.startswith(f"| {name}.yaml |"))
        assert row.split("|")[6].strip() == "3"  # three training steps logged
    assert "cores" in text and "fit --config configs/ppo.yaml" in text
    assert (tmp_path / "curves.png").stat().st_size > 0
