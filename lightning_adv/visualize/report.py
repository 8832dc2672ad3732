"""``python -m lightning_adv report runs/<name>/version_N``: one self-contained HTML page of a run.

The page holds the run's config, the curves of its reward, KL, entropy and advantage
statistics (and its losses and response lengths), its evaluation results, and the latest
advantage heatmaps, all read from the run directory (``config*.yaml`` and the TensorBoard
event files). Nothing is fetched when it is viewed: images are inlined as data URIs,
the style is inline, there is no script, and the page's content security policy forbids
loading anything else. It is written to ``<run>/report.html`` (``--out`` for another
file); an existing file is replaced only if it is an earlier report (nothing else is
overwritten).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional

from lightning_adv.visualize.report_data import GENERATOR, read_run


def write_report(directory: str | os.PathLike, out: Optional[str | os.PathLike] = None) -> Path:
    """Write the report of the run ``directory`` to ``out`` (default
    ``<directory>/report.html``); returns its path.

    Raises:
        FileNotFoundError: not a run directory (see :func:`read_run`).
        FileExistsError: ``out`` exists and is not an earlier report.
        ImportError: matplotlib is not installed (the ``plot`` extra).
    """
    from lightning_adv.visualize.report_page import render_page

    run = read_run(Path(directory))
    path = Path(out) if out is not None else run.directory / "report.html"
    if path.exists() and not _is_report(path):
        raise FileExistsError(f"report: {str(path)!r} exists and is not a report written by this "
                              f"command; it is left as it is (choose another file with --out)")
    page = render_page(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written beside its place and renamed: a reader never sees half a page.
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with open(partial, "x", encoding="utf-8") as f:
            f.write(page)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def _is_report(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return GENERATOR in f.read(4096)
    except OSError:
        return False


def main(args: Optional[list[str]] = None) -> None:
    """``python -m lightning_adv report RUN_DIR [--out FILE]``."""
    parser = argparse.ArgumentParser(
        prog="python -m lightning_adv report",
        description="Write one self-contained HTML page of a training run: its config, the "
                    "curves of reward, KL, entropy and advantage statistics, its evaluation "
                    "results and the latest advantage heatmaps (needs matplotlib: pip install "
                    "'lightning_adv[plot]').")
    parser.add_argument("run_dir", help="the run directory, e.g. runs/ppo/version_0")
    parser.add_argument("--out", default=None,
                        help="the HTML file to write (default: RUN_DIR/report.html; an existing "
                             "file is replaced only if it is an earlier report)")
    parsed = parser.parse_args(args)
    try:
        path = write_report(parsed.run_dir, parsed.out)
    except (FileNotFoundError, FileExistsError) as exc:
        parser.exit(2, f"error: {exc}\n")
    except ImportError as exc:
        parser.exit(2, f"error: report: drawing the curves needs matplotlib (pip install "
                       f"'lightning_adv[plot]'): {exc}\n")
    print(f"report: wrote {path}", file=sys.stdout, flush=True)
