"""What the benchmark scripts share: thread settings made before torch loads, child
processes that report one JSON line, trees of this repository at a commit, the tiny
Hugging Face model, the machine's description and the markdown page of a run.

Standard library only: a script imports this before torch, and a child process running
the package of another commit imports it too.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import shlex
import subprocess
import sys
import tarfile
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
#: The first word of the stdout line in which a child process reports its result.
RESULT_MARKER = "BENCHMARK_RESULT"
DETERMINISM_NOTE = (
    "Nothing in these timings is deterministic: they move with the machine's load, its "
    "clock and the run. The comparable quantities are the ratios between cases measured "
    "side by side in one run; compare absolute times only between runs on the same idle "
    "machine.")


# ---------------------------------------------------------------------------- threads


def threads_from_argv(argv: Sequence[str], default: Sequence[int]) -> list[int]:
    """The ``--threads`` counts of a command line, read before the full parse (which may
    need torch): the scripts set the thread environment from them before torch loads."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--threads", type=int, nargs="+", default=list(default))
    known, _ = parser.parse_known_args(list(argv))
    if min(known.threads) < 1:
        raise SystemExit(f"--threads: expected counts of at least 1, got "
                         f"{' '.join(map(str, known.threads))}")
    return known.threads


def set_thread_environment(threads: int) -> None:
    """Settings OpenMP and MKL read once, when torch loads them: waiting OpenMP threads
    sleep (``OMP_WAIT_POLICY=PASSIVE`` unless the caller set a policy; spinning threads
    hold the cores the working ones need on a shared machine) and ``threads`` threads."""
    if "torch" in sys.modules:
        raise RuntimeError("set_thread_environment: torch is already imported; OpenMP has "
                           "read its settings")
    if threads < 1:
        raise SystemExit(f"--threads: expected counts of at least 1, got {threads}")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["MKL_NUM_THREADS"] = str(threads)


def thread_note(threads: Sequence[int]) -> str:
    return (f"{' and '.join(map(str, threads))} intra-op thread(s), "
            f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")


# ---------------------------------------------------------------------------- children


def report_result(value: Any) -> None:
    """The result of a child process, as the line :func:`run_child` reads."""
    print(RESULT_MARKER, json.dumps(value), flush=True)


def child_environment(tree: Path, threads: int) -> dict[str, str]:
    """The environment of a child that imports ``lightning_adv`` from ``tree`` only."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONWARNINGS": "ignore"}
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def run_child(args: Sequence[str], tree: Path, threads: int, what: str,
              extra_env: Optional[dict[str, str]] = None) -> Any:
    """Run ``python args...`` in ``tree`` with ``tree`` as the package's home and return the
    JSON its last :func:`report_result` line holds; a failure raises with its stderr's end."""
    env = {**child_environment(tree, threads), **(extra_env or {})}
    run = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True,
                         text=True)
    lines = [line for line in run.stdout.splitlines() if line.startswith(RESULT_MARKER + " ")]
    if run.returncode or not lines:
        raise RuntimeError(f"{what} failed (exit status {run.returncode}):\n"
                           f"{run.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT_MARKER) + 1:])


def check_package_home(tree: Path) -> str:
    """Import ``lightning_adv`` and check it is the one under ``tree`` (not an installed
    copy); returns its directory as a published page shows it (:func:`shown_path`)."""
    import lightning_adv

    home = Path(lightning_adv.__file__).resolve().parent
    if not home.is_relative_to(tree.resolve()):
        raise RuntimeError(f"lightning_adv was imported from {home}, not from {tree}")
    return shown_path(home)


def shown_path(path: Path | str) -> str:
    """``path`` as a page shows it: relative to the repository root (``lightning_adv/``),
    never the measuring machine's absolute path, which a reader's checkout does not have."""
    resolved = Path(path).resolve()
    if resolved == ROOT:
        return "this checkout"
    if resolved.is_relative_to(ROOT):
        return str(resolved.relative_to(ROOT)) + ("/" if resolved.is_dir() else "")
    return resolved.name  # outside the checkout (a temporary directory): its name only


def use_this_checkout() -> None:
    """Make ``import lightning_adv`` load this checkout's package (the one next to
    ``benchmarks/``), ahead of an installed one."""
    if sys.path[:1] != [str(ROOT)]:
        sys.path.insert(0, str(ROOT))


# ---------------------------------------------------------------------------- git trees


def git(*args: str) -> str:
    try:
        run = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                             check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise SystemExit(f"git {' '.join(args)} failed in {ROOT} (the benchmarks need a git "
                         f"checkout of the repository): {detail.strip()}") from None
    return run.stdout.strip()


#: what the benchmarks themselves write: pages regenerated one after another leave these
#: changed, and they change nothing a benchmark measures
BENCHMARK_OUTPUTS = ("docs/benchmarks", "docs/images")


def commit_note() -> str:
    """This checkout's commit, and whether its working tree differs from it (outside
    :data:`BENCHMARK_OUTPUTS`)."""
    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                    *(f":!{path}" for path in BENCHMARK_OUTPUTS))
    except SystemExit:
        return "not a git checkout"
    return commit + (" with uncommitted changes" if dirty else "")


def extract_tree(rev: str, into: Path) -> Path:
    """The repository's files at ``rev`` (``git archive``), unpacked into ``into``."""
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    into.mkdir(parents=True, exist_ok=True)
    archive = into.with_suffix(".tar")
    with archive.open("wb") as out:
        run = subprocess.run(["git", "-C", str(ROOT), "archive", commit], stdout=out,
                             stderr=subprocess.PIPE)
    if run.returncode:
        raise SystemExit(f"git archive {rev} failed: {run.stderr.decode().strip()}")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
    return into


def build_extensions(tree: Path) -> None:
    """Compile the C extensions a tree's ``pyproject.toml`` declares, in place, as
    ``pip install`` would have: a baseline runs the code its users ran."""
    pyproject = tree / "pyproject.toml"
    if not pyproject.exists():
        return
    setuptools = tomllib.loads(pyproject.read_text()).get("tool", {}).get("setuptools", {})
    if not setuptools.get("ext-modules"):
        return
    run = subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()",
                          "build_ext", "--inplace", "-q"], cwd=tree, capture_output=True,
                         text=True)
    if run.returncode:
        raise SystemExit(f"building the C extensions of {tree} failed (pass --no-build to "
                         f"run that tree without them):\n{run.stderr[-2000:]}")


def compiled_modules(tree: Path) -> list[str]:
    """The compiled extension modules inside a tree's package."""
    return sorted(str(p.relative_to(tree)) for p in (tree / "lightning_adv").rglob("*.so"))


def prepare_tree(rev: str, into: Path, build: bool) -> Path:
    tree = extract_tree(rev, into)
    if build:
        build_extensions(tree)
    return tree


def tree_note(name: str, tree: Path) -> str:
    compiled = compiled_modules(tree)
    where = "the working tree" if tree == ROOT else "extracted with git archive"
    return f"{name}: {where}; compiled extensions: {', '.join(compiled) if compiled else 'none'}"


# ---------------------------------------------------------------------------- tiny model


def make_tiny_model(tree: Path, out: Path) -> Path:
    """The tiny Hugging Face model, written by ``tree``'s own command:
    ``python -m lightning_adv make-tiny`` where the tree has it, else the older
    ``python -m lightning_adv.hf make-tiny``."""
    programs = ["lightning_adv", "lightning_adv.hf"]
    entry_points = [tree / "lightning_adv" / name for name in ("__main__.py", "cli.py")]
    if not any("make-tiny" in p.read_text() for p in entry_points if p.exists()):
        programs.reverse()  # an older tree, whose CLI takes seconds to refuse the new command
    errors = []
    for program in programs:
        run = subprocess.run([sys.executable, "-m", program, "make-tiny", "--out", str(out)],
                             cwd=tree, env=child_environment(tree, 1), capture_output=True,
                             text=True)
        if run.returncode == 0 and (out / "config.json").exists():
            return out
        errors.append(f"python -m {program} make-tiny: {run.stderr.strip()[-800:]}")
    raise RuntimeError("making the tiny model failed:\n" + "\n".join(errors))


# ---------------------------------------------------------------------------- the page


def machine_note() -> str:
    """CPU model, cores, memory and load average."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo
                          if line.startswith("model name")), model)
    except OSError:
        pass
    memory = ""
    try:
        with open("/proc/meminfo") as meminfo:
            kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
        memory = f", {kib / 2**20:.0f} GiB memory"
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{model}, {os.cpu_count()} cores{memory}; load average {load:.2f}"


def versions_note() -> str:
    found = []
    for name in ("torch", "lightning", "transformers"):
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return f"Python {sys.version.split()[0]}, " + ", ".join(found)


def command_line() -> str:
    """The command as a user types it from the repository root: ``python`` for this
    interpreter (whichever path it has here), paths inside the checkout relative to it."""
    argv = list(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    shown = ["python"] + [shown_path(arg) if Path(arg).is_absolute() else arg
                          for arg in argv[1:]]
    return shlex.join(shown)


def page_header(title: str, details: Sequence[str] = ()) -> str:
    """The start of a page: title, date, machine, versions, command, commit and the
    script's own details (threads, trees, sizes)."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# {title}", "", f"- Date: {now}", f"- Machine: {machine_note()}",
             f"- Versions: {versions_note()}", f"- Command: `{command_line()}`",
             f"- Commit: {commit_note()}"]
    lines += [f"- {detail}" for detail in details]
    return "\n".join(lines) + "\n"


def write_page(path: Optional[Path], header: str, sections: Sequence[str],
               deterministic: str = "") -> None:
    """Print the tables; with ``path``, also write the page: header, tables and what in
    them is deterministic (:data:`DETERMINISM_NOTE`, after ``deterministic``)."""
    body = "\n".join(sections)
    print(body, flush=True)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        note = f"{deterministic} {DETERMINISM_NOTE}" if deterministic else DETERMINISM_NOTE
        path.write_text(f"{header}\n{body}\n{note}\n")
        print(f"wrote {path}")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def format_time(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def format_ratio(value: float) -> str:
    if value < 10:
        return f"{value:.2f}×"
    return f"{value:.1f}×" if value < 100 else f"{value:.0f}×"
