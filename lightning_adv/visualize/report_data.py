"""What a run's report shows, read from its run directory: the config files and the
TensorBoard event files (scalars and the latest advantage heatmaps)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

#: marks a page this command wrote (so that writing the report again may replace it)
GENERATOR = '<meta name="generator" content="lightning_adv report">'


@dataclass
class RunData:
    """What the report shows, read from a run directory."""

    directory: Path
    configs: dict[str, str]
    """file name -> text of each ``config*.yaml`` (``hparams.yaml`` without one)"""
    scalars: dict[str, list[tuple[int, float, float]]]
    """tag -> ``(step, value, wall time)`` of each logged value, in step order"""
    images: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    """heatmap tag -> ``(step, PNG bytes)`` of its latest image"""
    event_files: int = 0


def read_run(directory: Path) -> RunData:
    """The config files and the TensorBoard events of the run ``directory``.

    Raises:
        FileNotFoundError: ``directory`` is not a directory, or holds no event file.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not directory.is_dir():
        raise FileNotFoundError(f"report: {str(directory)!r} is not a directory (expected a run "
                                f"directory such as runs/ppo/version_0)")
    events = sorted(directory.glob("events.out.tfevents.*"))
    if not events:
        raise FileNotFoundError(f"report: {str(directory)!r} holds no TensorBoard event file "
                                f"(events.out.tfevents.*); expected a run directory such as "
                                f"runs/ppo/version_0")
    configs = {p.name: p.read_text() for p in sorted(directory.glob("config*.yaml"))}
    if not configs and (directory / "hparams.yaml").is_file():
        configs["hparams.yaml"] = (directory / "hparams.yaml").read_text()
    accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0, "images": 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    scalars = {tag: sorted((e.step, e.value, e.wall_time) for e in accumulator.Scalars(tag))
               for tag in tags.get("scalars", [])}
    images = {}
    for tag in tags.get("images", []):
        if "advantage_heatmap" in tag:
            last = max(accumulator.Images(tag), key=lambda e: (e.step, e.wall_time))
            images[tag] = (last.step, last.encoded_image_string)
    return RunData(directory, configs, scalars, images, len(events))
