"""Reward curves and a summary table from the trainer's TensorBoard logs.

    python scripts/reward_curve.py runs/ppo/version_0 runs/turn_gae/version_0 \
        --out curves.png

Reads ``train/task_reward`` from each run's event files, draws the per-step reward
(faint) and its moving average (bold) for every run into one PNG, and writes a markdown
table: start reward (step 0, and the mean of the first ``--window`` steps), end reward
(mean of the last ``--window`` steps), steps, and training wall time (first to last
logged step, from the event timestamps; process start-up is not included).

Needs Pillow (installed with tensorboard) to draw; ``--table`` alone needs nothing else.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TAG = "train/task_reward"
COLORS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14),
          (140, 86, 75), (227, 119, 194), (127, 127, 127)]  # matplotlib's tab10


@dataclass
class Run:
    label: str
    steps: list[int]
    rewards: list[float]
    wall_times: list[float]

    def start(self, window: int) -> float:
        return sum(self.rewards[:window]) / len(self.rewards[:window])

    def end(self, window: int) -> float:
        return sum(self.rewards[-window:]) / len(self.rewards[-window:])

    @property
    def seconds(self) -> float:
        return self.wall_times[-1] - self.wall_times[0]


def load(log_dir: Path, label: str) -> Run:
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    if TAG not in events.Tags()["scalars"]:
        raise SystemExit(f"{log_dir}: no '{TAG}' scalars (is it a lightning_adv run directory?)")
    points = sorted(events.Scalars(TAG), key=lambda e: e.step)
    return Run(label, [e.step for e in points], [e.value for e in points],
               [e.wall_time for e in points])


def moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def table(runs: list[Run], window: int) -> str:
    lines = [
        f"| config | start reward (step 0) | start (mean of first {window}) | "
        f"end (mean of last {window}) | end / start | steps | wall time |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        start0, start, end = run.rewards[0], run.start(window), run.end(window)
        minutes, seconds = divmod(round(run.seconds), 60)
        ratio = f"{end / start:.1f}x" if start else "-"  # a start of 0 has no ratio
        lines.append(f"| {run.label} | {start0:.3f} | {start:.3f} | {end:.3f} | "
                     f"{ratio} (+{end - start:.2f}) | {len(run.steps)} | "
                     f"{minutes}m {seconds:02d}s |")
    return "\n".join(lines) + "\n"


def draw(runs: list[Run], out: Path, window: int, x_label: str = "training step (rollout)",
         y_label: str = "mean task reward per step") -> None:
    from PIL import Image, ImageDraw, ImageFont

    legend_width = 190  # the legend sits right of the plot, never over a curve
    width, height = 900 + legend_width, 480
    left, right, top, bottom = 70, 30 + legend_width, 40, 60
    image = Image.new("RGB", (width, height), "white")
    pen = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=14)
    max_step = max(max(r.steps) for r in runs) + 1
    tick = next(t * 10 ** k for k in range(8) for t in (1, 2, 5) if max_step / (t * 10 ** k) <= 6)
    y_max = max(1.0, max(max(r.rewards) for r in runs))

    def xy(step: float, value: float) -> tuple[float, float]:
        x = left + (width - left - right) * step / max_step
        y = height - bottom - (height - top - bottom) * value / y_max
        return x, y

    for i in range(6):  # horizontal grid and y labels
        value = y_max * i / 5
        _, y = xy(0, value)
        pen.line([(left, y), (width - right, y)], fill=(225, 225, 225))
        pen.text((left - 40, y - 8), f"{value:.1f}", fill="black", font=font)
    for step in range(0, max_step + 1, tick):  # x ticks
        x, _ = xy(step, 0)
        pen.line([(x, height - bottom), (x, height - bottom + 5)], fill="black")
        pen.text((x - 10, height - bottom + 8), str(step), fill="black", font=font)
    pen.rectangle([left, top, width - right, height - bottom], outline="black")
    pen.text(((width - legend_width) // 2 - 70, height - 28), x_label,
             fill="black", font=font)
    pen.text((10, top - 28), f"{y_label} (bold: moving average of {window})",
             fill="black", font=font)

    for k, run in enumerate(runs):
        color = COLORS[k % len(COLORS)]
        faint = tuple(c + (255 - c) * 2 // 3 for c in color)
        pen.line([xy(s, v) for s, v in zip(run.steps, run.rewards)], fill=faint, width=1)
        smooth = moving_average(run.rewards, window)
        pen.line([xy(s, v) for s, v in zip(run.steps, smooth)], fill=color, width=3)
        lx, ly = width - right + 15, top + 22 * k
        pen.line([(lx, ly + 8), (lx + 25, ly + 8)], fill=color, width=3)
        pen.text((lx + 32, ly), run.label, fill="black", font=font)
    out.parent.mkdir(parents=True, exist_ok=True)
    image.save(out, optimize=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run log dirs (runs/ppo/version_0)")
    parser.add_argument("--labels", nargs="*", help="one label per run (default: the run's name)")
    parser.add_argument("--out", type=Path, help="PNG to write")
    parser.add_argument("--table", type=Path, help="markdown table to write (also printed)")
    parser.add_argument("--window", type=int, default=10, help="steps averaged for start/end")
    args = parser.parse_args()
    labels = args.labels or [p.parent.name if p.name.startswith("version_") else p.name
                             for p in args.runs]
    if len(labels) != len(args.runs):
        parser.error("--labels: give one label per run")
    runs = [load(path, label) for path, label in zip(args.runs, labels)]
    text = table(runs, args.window)
    print(text, end="")
    if args.table:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text(text)
    if args.out:
        draw(runs, args.out, args.window)


if __name__ == "__main__":
    main()
