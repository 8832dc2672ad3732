"""The report's HTML page (:mod:`~lightning_adv.visualize.report`): curves drawn with
matplotlib as inline PNGs, tables, the heatmaps from the event files, the config.

Importing this module imports matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import math

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lightning_adv.visualize.report_data import GENERATOR, RunData

#: the curve panels: title, the tags drawn (those the run logged), what they show
PANELS = [
    ("Reward", ["train/task_reward", "train/rlhf_reward", "train/greedy_reward",
                "val/reward_greedy", "val/reward_mean"],
     "task reward per episode (train), with the KL and process terms (rlhf), held-out"),
    ("KL", ["train/kl_rewards", "train/approx_kl", "train/kl_loss", "train/kl_coef"],
     "token mean of the KL penalty, the update's approximate KL, the KL coefficient"),
    ("Entropy", ["train/entropy"], "token mean of the policy's entropy"),
    ("Advantages", ["train/advantages_mean", "train/advantages_std", "train/advantages_min",
                    "train/advantages_max"], "token statistics of the advantages trained on"),
    ("Advantages before normalization",
     ["train/unnormalized_advantages_mean", "train/unnormalized_advantages_std",
      "train/unnormalized_advantages_min", "train/unnormalized_advantages_max"],
     "the estimator's, before actor.adv_norm"),
    ("Groups without signal", ["train/zero_adv_group_frac"],
     "fraction of prompt groups whose advantages are all 0"),
    ("Losses", ["train/policy_loss", "train/value_loss", "train/clipfrac"],
     "policy and value loss, clipped fraction"),
    ("Response length", ["train/response_length"], "generated tokens per episode"),
]

#: the evaluation stages, in the order of their tables
STAGES = ("val", "test")

#: the page forbids every load but its own inline images and style: nothing from a network
POLICY = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
          "base-uri 'none'; form-action 'none'")

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto;
       max-width: 1180px; padding: 0 16px; color: #1d1d1f; background: #fff; }
h1 { font-size: 1.6em; margin-bottom: 4px; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.meta { color: #555; margin-top: 0; } nav a { margin-right: 14px; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(360px, 1fr)); gap: 12px; }
figure { margin: 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; }
table { border-collapse: collapse; font-size: 0.9em; margin-bottom: 12px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
tr.last td { font-weight: bold; }
pre { background: #f7f7f7; padding: 10px; overflow-x: auto; font-size: 0.85em; }
.heatmaps { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 12px; }
"""


def render_page(run: RunData) -> str:
    """The report of ``run`` as one HTML document."""
    name = "/".join(run.directory.resolve().parts[-2:])
    sections = [("summary", "Summary", _summary(run)), ("curves", "Curves", _curves(run)),
                ("evaluation", "Evaluation", _evaluation(run)),
                ("heatmaps", "Latest advantage heatmaps", _heatmaps(run)),
                ("config", "Config", _configs(run))]
    nav = " ".join(f'<a href="#{key}">{title}</a>' for key, title, _ in sections)
    body = "\n".join(f'<section id="{key}">\n<h2>{title}</h2>\n{content}\n</section>'
                     for key, title, content in sections)
    made = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n{GENERATOR}\n'
            f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<title>{html.escape(name)}: lightning_adv run report</title>\n'
            f'<style>{STYLE}</style>\n</head>\n<body>\n'
            f'<h1>Run report: {html.escape(name)}</h1>\n'
            f'<p class="meta">{html.escape(str(run.directory.resolve()))} · written {made} by '
            f'<code>python -m lightning_adv report</code></p>\n<nav>{nav}</nav>\n'
            f'{body}\n</body>\n</html>\n')


def _summary(run: RunData) -> str:
    rewards = run.scalars.get("train/task_reward", [])
    rows = [("event files", str(run.event_files))]
    if rewards:
        window = max(1, min(10, len(rewards) // 5))
        first = sum(v for _, v, _ in rewards[:window]) / window
        last = sum(v for _, v, _ in rewards[-window:]) / window
        seconds = rewards[-1][2] - rewards[0][2]
        rows += [("training steps logged", f"{len(rewards)} (steps {rewards[0][0]} to "
                                           f"{rewards[-1][0]})"),
                 (f"train/task_reward, first {window} steps", _number(first)),
                 (f"train/task_reward, last {window} steps", _number(last)),
                 ("training time (first to last logged step)", f"{seconds:.0f} s")]
    else:
        rows.append(("training steps logged", "0 (no train/task_reward in the event files)"))
    cells = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def _curves(run: RunData) -> str:
    figures = []
    for title, tags, what in PANELS:
        present = [t for t in tags if run.scalars.get(t)]
        if present:
            png = _panel_png(title, {t: run.scalars[t] for t in present})
            figures.append(f'<figure>{_img(png, title)}<figcaption>{html.escape(what)}'
                           f'</figcaption></figure>')
    if not figures:
        return "<p>The event files hold none of the report's curves.</p>"
    return '<div class="grid">\n' + "\n".join(figures) + "\n</div>"


def _panel_png(title: str, series: dict[str, list[tuple[int, float, float]]]) -> bytes:
    """One panel: each tag's values by step; a long noisy series faint, with its moving
    average over a twentieth of its length drawn over it."""
    fig = Figure(figsize=(4.6, 2.8), dpi=100, facecolor="white")
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_axes([0.13, 0.16, 0.84, 0.72])
    for k, (tag, points) in enumerate(series.items()):
        color = f"C{k}"
        steps = [p[0] for p in points]
        values = [p[1] for p in points]
        window = len(values) // 20
        if window > 1:
            ax.plot(steps, values, color=color, alpha=0.25, linewidth=0.8)
            smooth = [sum(values[max(0, i - window + 1): i + 1]) / len(values[max(0, i - window + 1): i + 1])
                      for i in range(len(values))]
            ax.plot(steps, smooth, color=color, linewidth=1.6, label=tag)
        else:
            ax.plot(steps, values, color=color, linewidth=1.4, label=tag,
                    marker="o" if len(values) < 12 else None, markersize=3)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("training step", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6.5, loc="best")
    buffer = io.BytesIO()
    canvas.print_png(buffer)
    return buffer.getvalue()


def _evaluation(run: RunData) -> str:
    parts = []
    for stage in STAGES:
        tags = sorted(t for t in run.scalars if t.startswith(f"{stage}/"))
        if not tags:
            continue
        steps = sorted({s for t in tags for s, _, _ in run.scalars[t]})
        values = {t: {s: v for s, v, _ in run.scalars[t]} for t in tags}
        head = "".join(f"<th>{html.escape(t)}</th>" for t in tags)
        rows = []
        for n, step in enumerate(steps):
            cells = "".join(f"<td>{_number(values[t].get(step))}</td>" for t in tags)
            last = ' class="last"' if n == len(steps) - 1 else ""
            rows.append(f"<tr{last}><td>{step}</td>{cells}</tr>")
        parts.append(f"<h3>{stage}</h3>\n<table><tr><th>step</th>{head}</tr>"
                     + "".join(rows) + "</table>")
    if not parts:
        return ("<p>No evaluation was logged (evaluation.num_prompts: 0, or no validation ran "
                "in this run).</p>")
    return "\n".join(parts)


def _heatmaps(run: RunData) -> str:
    if not run.images:
        return ("<p>No advantage heatmap was logged (sample_log.every_n_steps or "
                "sample_log.heatmap_groups 0, or matplotlib missing during training).</p>")
    order = sorted(run.images, key=lambda t: (t.split("/")[0] != "train", t))
    return '<div class="heatmaps">\n' + "\n".join(
        f'<figure>{_img(run.images[t][1], t)}<figcaption>{html.escape(t)}, step '
        f'{run.images[t][0]}</figcaption></figure>' for t in order) + "\n</div>"


def _configs(run: RunData) -> str:
    if not run.configs:
        return "<p>No config.yaml in the run directory.</p>"
    return "\n".join(f"<details open><summary>{html.escape(name)}</summary>"
                     f"<pre>{html.escape(text)}</pre></details>"
                     for name, text in run.configs.items())


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'


def _number(value: float | None) -> str:
    if value is None:
        return ""
    if math.isnan(value):
        return "nan"
    return f"{value:.4g}"
