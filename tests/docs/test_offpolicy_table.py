"""The script that writes the off-policy learning table runs end to end (two short runs):
each correction's config applies (the script checks its metric was logged) and the page
has one row per staleness and correction."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_offpolicy_table_script_writes_the_page(tmp_path):
    out = tmp_path / "off_policy.md"
    small = ["--model.ppo.prompts_per_step=4", "--model.ppo.n_samples=2",
             "--model.ppo.minibatches=2"]
    subprocess.run([sys.executable, "scripts/offpolicy_table.py", "--staleness", "1",
                    "--corrections", "none", "icepop", "--seeds", "0", "--steps", "2",
                    "--window", "1", "--out", str(out), *[f"--override={a}" for a in small]],
                   cwd=ROOT, check=True, timeout=600, capture_output=True)
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines()
            if line.startswith("| 1 |")]
    assert [r[1].strip() for r in rows] == ["no correction", "IcePop (token, 0.5_5)"]
    assert rows[0][6].strip() == "-" and rows[1][6].strip().endswith("%")
    assert all(float(r[5]) >= 0 for r in rows)  # a mismatch KL was logged: the bf16 sampler
    assert "cores" in out.read_text() and "offpolicy_table.py" in out.read_text()
