"""Draw the pictures of the heatmaps guide (docs/guides/heatmaps.md) from real runs.

    python scripts/heatmap_pictures.py --out docs/guides/heatmaps

Trains two shipped configs for ``--steps`` steps each (logs in a temporary directory,
heatmaps at the first and the last step): ``turn_gae`` (multi-turn, a critic, advantage
normalization) and ``gvpo_prm`` (process rewards). Writes, as TensorBoard shows them, the
latest ``train/advantage_heatmap`` of each run and the ``_raw`` one of ``turn_gae``, then
runs ``python -m lightning_adv report`` on the ``turn_gae`` run, opens the page in
headless Chromium and keeps the top of its screenshot. Needs matplotlib (the ``plot``
extra) and Chromium.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from matplotlib import image as mpimg
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_adv.testing.browser import render_page

ROOT = Path(__file__).resolve().parents[1]

#: picture file -> (config, image tag)
HEATMAPS = {"turn_gae_heatmap.png": ("turn_gae", "train/advantage_heatmap"),
            "turn_gae_heatmap_raw.png": ("turn_gae", "train/advantage_heatmap_raw"),
            "gvpo_prm_heatmap.png": ("gvpo_prm", "train/advantage_heatmap")}


def train(config: str, save_dir: Path, steps: int) -> Path:
    subprocess.run([sys.executable, "-m", "lightning_adv", "fit", "--config",
                    str(ROOT / "configs" / f"{config}.yaml"),
                    f"--trainer.logger.init_args.save_dir={save_dir}",
                    f"--trainer.limit_train_batches={steps}",
                    f"--model.sample_log.every_n_steps={max(1, steps - 1)}",
                    "--trainer.enable_progress_bar=false"],
                   check=True, cwd=ROOT)
    return save_dir / config / "version_0"


def latest_image(run: Path, tag: str) -> tuple[int, bytes]:
    events = EventAccumulator(str(run), size_guidance={"images": 0})
    events.Reload()
    last = max(events.Images(tag), key=lambda e: e.step)
    return last.step, last.encoded_image_string


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "guide" / "heatmaps")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--report-height", type=int, default=1850,
                        help="pixels of the report's screenshot kept, from the top")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="heatmap_pictures_") as tmp:
        runs = {config: train(config, Path(tmp), args.steps)
                for config in sorted({c for c, _ in HEATMAPS.values()})}
        for name, (config, tag) in HEATMAPS.items():
            step, png = latest_image(runs[config], tag)
            (args.out / name).write_bytes(png)
            print(f"{args.out / name}: {config} {tag} at step {step}")
        report = Path(tmp) / "report.html"
        subprocess.run([sys.executable, "-m", "lightning_adv", "report", str(runs["turn_gae"]),
                        "--out", str(report)], check=True, cwd=ROOT)
        rendered = render_page(report, width=1200)
        if rendered.console_errors or rendered.broken_images:
            raise SystemExit(f"the report did not render cleanly: {rendered.console_errors}, "
                             f"{rendered.broken_images} broken images")
        shot = Path(tmp) / "report.png"
        shot.write_bytes(rendered.screenshot)
        pixels = mpimg.imread(shot)
        mpimg.imsave(args.out / "report.png", pixels[: args.report_height])
        print(f"{args.out / 'report.png'}: the top {args.report_height} pixels of the report "
              f"of {runs['turn_gae'].name} ({pixels.shape[0]} in all)")


if __name__ == "__main__":
    main()
