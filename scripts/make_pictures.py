"""Regenerate the pictures of the documentation (``docs/images/``):

- ``layers.png``: the package's layers, drawn from the table that
  ``tests/core/test_layers.py`` enforces (``LAYERS``), so the picture cannot drift from
  the imports;
- ``tensorboard.png``: TensorBoard showing a real run (``configs/ppo.yaml``, trained here
  for ``--steps`` steps): the task reward, the KL penalty and the advantages. TensorBoard
  serves on 127.0.0.1 only and headless Chromium takes the screenshot
  (``apt-get install -y chromium`` on Debian);
- with ``--curves``, the reward curves ``seed_curves.png`` and ``hf_reward_curves.png``,
  by running the learning benchmark, which also rewrites its pages (the table and the
  picture come from the same runs; this trains every shipped config, about half an hour
  on a 2-core machine)::

    python scripts/make_pictures.py                  # layers and the TensorBoard screenshot
    python scripts/make_pictures.py --only layers
    python scripts/make_pictures.py --curves         # also the learning pages and curves
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
if str(ROOT) not in sys.path:  # the layer table is tests/core/test_layers.py of this checkout
    sys.path.insert(0, str(ROOT))

#: the scalars the screenshot shows (TensorBoard's tag filter)
TAGS = "train/(task_reward|kl_rewards|unnormalized_advantages_mean|advantages_max)"
CURVES = [
    ["--configs", "ppo", "grpo", "turn_gae", "turn_rloo", "gigpo", "--seeds", "1", "2", "3",
     "--page", "docs/benchmarks/learning-seeds.md", "--plot", "docs/images/seed_curves.png"],
    ["--configs", "hf_grpo", "hf_ppo",
     "--page", "docs/benchmarks/learning-hf.md", "--plot", "docs/images/hf_reward_curves.png"],
]


# ---------------------------------------------------------------------------- layers


def draw_layers(out: Path) -> None:
    """One band per layer, layer 0 at the bottom, with the modules the table puts there."""
    from PIL import Image, ImageDraw, ImageFont

    from tests.core.test_layers import LAYERS

    ranks: dict[int, list[str]] = {}
    for module, rank in LAYERS.items():
        short = module.removeprefix("lightning_adv.") if module != "lightning_adv" else \
            "lightning_adv (the re-exports)"
        if module != "lightning_adv" and any(m.startswith(module + ".") for m in LAYERS):
            short += " (the rest)"
        ranks.setdefault(rank, []).append(short)
    font, small = ImageFont.load_default(size=17), ImageFont.load_default(size=14)
    band, gap, left, width = 46, 8, 20, 960
    height = 70 + len(ranks) * (band + gap) + 40
    image = Image.new("RGB", (width, height), "white")
    pen = ImageDraw.Draw(image)
    pen.text((left, 16), "lightning_adv: each module imports only its own layer or the "
             "layers below", fill="black", font=font)
    pen.text((left, 40), "(drawn from tests/core/test_layers.py, which checks every import "
             "against it)", fill=(90, 90, 90), font=small)
    application = max(ranks) - 1  # the trainer and the command line sit on the library
    for i, rank in enumerate(sorted(ranks, reverse=True)):
        top = 70 + i * (band + gap)
        fill = (255, 236, 214) if rank >= application else (222, 235, 250)
        edge = (230, 140, 40) if rank >= application else (60, 120, 200)
        pen.rounded_rectangle([left, top, width - left - 40, top + band], radius=8, fill=fill,
                              outline=edge, width=2)
        pen.text((left + 14, top + 13), f"layer {rank}", fill=edge, font=font)
        pen.text((left + 110, top + 13), "  ·  ".join(ranks[rank]), fill="black", font=font)
    arrow_x, top, bottom = width - 35, 80, height - 50
    pen.line([(arrow_x, top), (arrow_x, bottom)], fill=(120, 120, 120), width=3)
    pen.polygon([(arrow_x - 8, bottom - 12), (arrow_x + 8, bottom - 12), (arrow_x, bottom)],
                fill=(120, 120, 120))
    pen.text((left, height - 32), "blue: the library users import; orange: the trainer and "
             "its command line, built on it. Arrow: the direction of imports.",
             fill=(90, 90, 90), font=small)
    out.parent.mkdir(parents=True, exist_ok=True)
    image.save(out, optimize=True)


# ---------------------------------------------------------------------------- TensorBoard


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("make_pictures: no Chromium found (apt-get install -y chromium)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def tensorboard(logdir: Path) -> Iterator[str]:
    """A TensorBoard server on 127.0.0.1 for ``logdir``; yields its address."""
    port = free_port()
    # Served from the run's parent directory, so the page names it "runs", not a temp path.
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", logdir.name,
                               "--host", "127.0.0.1", "--port", str(port)], cwd=logdir.parent,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{address}/data/runs", timeout=5) as reply:
                    if b"version_0" in reply.read():
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("make_pictures: TensorBoard did not start")
            time.sleep(1)
        yield address
    finally:
        server.terminate()
        server.wait(timeout=30)


def screenshot_tensorboard(out: Path, steps: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tensorboard_shot_") as tmp:
        runs = Path(tmp) / "runs"
        subprocess.run([sys.executable, "-m", "lightning_adv", "fit", "--config",
                        str(ROOT / "configs" / "ppo.yaml"),
                        f"--trainer.logger.init_args.save_dir={runs}",
                        f"--trainer.limit_train_batches={steps}",
                        "--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false",
                        "--model.evaluation.num_prompts=0"],
                       check=True, cwd=tmp, stdout=subprocess.DEVNULL,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
        with tensorboard(runs) as address:
            url = (f"{address}/?darkMode=false#scalars&tagFilter="
                   + urllib.request.quote(TAGS, safe=""))
            out.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                            "--hide-scrollbars", "--window-size=1400,760",
                            "--virtual-time-budget=30000", f"--screenshot={out}", url],
                           check=True, capture_output=True, timeout=300)
    from PIL import Image

    with Image.open(out) as image:  # a palette PNG is a third of the size, and looks the same
        image.convert("RGB").quantize(colors=128).save(out, optimize=True)


# ---------------------------------------------------------------------------- main


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=("layers", "tensorboard"),
                        help="only these pictures (default: both)")
    parser.add_argument("--steps", type=int, default=100,
                        help="training steps of the run TensorBoard shows (default 100)")
    parser.add_argument("--curves", action="store_true",
                        help="also run the learning benchmark: its pages and reward curves")
    args = parser.parse_args(argv)
    chosen = args.only or ["layers", "tensorboard"]
    if "layers" in chosen:
        draw_layers(IMAGES / "layers.png")
        print(f"wrote {IMAGES / 'layers.png'}")
    if "tensorboard" in chosen:
        screenshot_tensorboard(IMAGES / "tensorboard.png", args.steps)
        print(f"wrote {IMAGES / 'tensorboard.png'}")
    if args.curves:
        for command in CURVES:
            subprocess.run([sys.executable, "benchmarks/learning.py", *command], check=True,
                           cwd=ROOT)


if __name__ == "__main__":
    main()
