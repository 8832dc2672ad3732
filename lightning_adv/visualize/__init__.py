"""Pictures of what the advantage pipeline did: per-token heatmaps, and a run's report.

- :func:`advantage_heatmap` draws responses token by token, coloured by advantage (with
  process rewards and critic values as strips): a figure and an image array;
- :func:`heatmap_inputs` and :func:`token_aligned` take its inputs from a rollout batch
  and the ``AdvantageModule``'s output;
- :mod:`lightning_adv.visualize.report` writes one self-contained HTML page for a run
  directory (``python -m lightning_adv report runs/<name>/version_N``).

Drawing needs matplotlib, the ``plot`` extra (``pip install 'lightning_adv[plot]'``);
importing this package does not import it.
"""

from lightning_adv.visualize.heatmap import advantage_heatmap
from lightning_adv.visualize.heatmap_data import Heatmap, TokenCell
from lightning_adv.visualize.inputs import heatmap_inputs, token_aligned

__all__ = ["advantage_heatmap", "Heatmap", "TokenCell", "heatmap_inputs", "token_aligned"]
