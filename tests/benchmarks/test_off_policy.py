"""benchmarks/off_policy.py runs end to end (two short runs): each correction's config
applies (the script checks its metric was logged) and the page has the header, one row per
staleness and correction, and the command."""

import subprocess
import sys
from pathlib import Path
from tests.support.scripts import shown_command

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--model.ppo.prompts_per_step=4", "--model.ppo.n_samples=2",
         "--model.ppo.minibatches=2"]


def test_off_policy_page_has_a_row_per_staleness_and_correction(tmp_path):
    page = tmp_path / "off-policy.md"
    # two runs at once: the rows still come in the order of the cells
    args = ["--staleness", "1", "--corrections", "none", "icepop", "--seeds", "0", "--steps",
            "2", "--window", "1", "--jobs", "2", *[f"--override={a}" for a in SMALL]]
    run = subprocess.run([sys.executable, "benchmarks/off_policy.py", *args, "--page", str(page)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    text = page.read_text()
    for field in ("# Off-policy learning", "- Date: ", "- Machine: ", "- Command: ",
                  "- Commit: ", "The rewards are deterministic on one machine"):
        assert field in text, field
    assert shown_command("benchmarks/off_policy.py", list(args)) in text  # as typed
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| 1 |")]
    assert [r[1].strip() for r in rows] == ["no correction", "IcePop (token, 0.5_5)"]
    assert rows[0][6].strip() == "-" and rows[1][6].strip().endswith("%")
    assert all(float(r[5]) >= 0 for r in rows)  # a mismatch KL was logged: the bf16 sampler


def test_a_correction_that_did_not_apply_fails_the_script(tmp_path):
    """A run whose log lacks its correction's metric is an error, not a row."""
    run = subprocess.run(
        [sys.executable, "benchmarks/off_policy.py", "--staleness", "0", "--corrections",
         "tis", "--seeds", "0", "--steps", "1", "--window", "1",
         "--override=--model.ppo.rollout_correction=null", *[f"--override={a}" for a in SMALL]],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode != 0
    assert "correction 'tis' logged no 'offpolicy/ratio_frac_high'" in run.stderr
