"""benchmarks/token_budget.py trains configs to one budget of sampled tokens and writes
its page (short runs here; the page's numbers are never asserted), and
scripts/regenerate_pages.py finds every page's command."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_runs_stop_at_the_budget_and_the_tree_pays_fewer_tokens_per_response(tmp_path):
    page, plot = tmp_path / "budget.md", tmp_path / "budget.png"
    run = subprocess.run(
        [sys.executable, "benchmarks/token_budget.py", "--configs", "grpo_reverse", "tree_grpo",
         "--seeds", "1", "2", "--budget", "2000", "--window", "2", "--jobs", "2",
         "--plot", str(plot), "--page", str(page)],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    text = page.read_text()
    for field in ("# Learning at an equal generated-token budget", "- Commit: ",
                  "Budget: 2000 sampled tokens per run; seeds 1 2",
                  "The rewards are deterministic on one machine", "![reward against sampled "
                  "tokens](budget.png)"):
        assert field in text, field
    rows = {}
    for name in ("grpo_reverse", "tree_grpo"):
        row = re.search(rf"^\| `{name}\.yaml` \| 2 of 2 \| (\d+) \[(\d+)-(\d+)\] \| .* \| "
                        rf"([\d.]+) \| ([\d.]+) \| ([\d.]+) \| \d+ \|$", text, re.M)
        assert row, (name, text)
        rows[name] = [float(v) for v in row.groups()]
    assert rows["grpo_reverse"][5] == 1.0   # flat: every generated token sampled once
    assert rows["tree_grpo"][5] < 1.0       # a tree samples each shared prefix once
    # the budget bought the tree more steps than the flat sampler
    assert rows["tree_grpo"][0] > rows["grpo_reverse"][0]
    assert plot.stat().st_size > 0


def test_every_page_but_the_index_records_the_command_that_regenerates_it():
    run = subprocess.run([sys.executable, "scripts/regenerate_pages.py", "--list"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    listed = dict(line.split(": ", 1) for line in run.stdout.splitlines())
    pages = {p.stem for p in (REPO / "docs" / "benchmarks").glob("*.md")} - {"index"}
    assert set(listed) == pages
    for name, command in listed.items():
        script = command.split()[0]
        assert (REPO / script).is_file(), (name, script)
        assert f"--page docs/benchmarks/{name}.md" in command, name


def test_regenerate_pages_names_an_unknown_page():
    run = subprocess.run([sys.executable, "scripts/regenerate_pages.py", "--only", "nope"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "no page with a command: nope" in run.stderr


def test_a_page_calls_only_changes_outside_the_benchmarks_outputs_uncommitted(tmp_path):
    # a clone of HEAD with the benchmark scripts, whose ROOT is the clone
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--depth", "1", f"file://{REPO}", str(clone)],
                   check=True)
    note = [sys.executable, "-c", "import harness; print(harness.commit_note())"]

    def commit_note():
        return subprocess.run(note, cwd=clone / "benchmarks", capture_output=True, text=True,
                              check=True).stdout.strip()

    head = commit_note()
    assert re.fullmatch(r"[0-9a-f]{40}", head)
    with (clone / "docs" / "benchmarks" / "index.md").open("a") as page:
        page.write("a page just written\n")
    assert commit_note() == head
    with (clone / "benchmarks" / "README.md").open("a") as code:
        code.write("a change a benchmark might measure\n")
    assert commit_note() == f"{head} with uncommitted changes"
