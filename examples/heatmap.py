"""Draw the advantages of a small built-in batch token by token, as your own trainer would.

The quickstart's batch (two prompts, three responses each, a critic) goes through an
``AdvantageModule``; ``heatmap_inputs`` takes each row's token texts, its advantages and
the critic's values (moved from the module's next-token convention to one entry per
token) and ``advantage_heatmap`` draws them. Needs matplotlib (``pip install
'lightning_adv[plot]'``).
Run: ``python -m examples.heatmap [out.png]`` (prints where each token's cell is; with a
file name, also saves the picture).
"""

import sys

from lightning_adv import ActorConfig, AdvantageModule, NormConfig, advantage_heatmap, heatmap_inputs
from examples.quickstart import small_batch


def main() -> None:
    batch, meta = small_batch()
    config = ActorConfig(discount=1.0, gae_lambda=0.95, kl_ctl=0.05,
                         reward_norm=NormConfig(mean_level="group", std_level="group"))
    out = AdvantageModule(config)(batch, meta)
    # the first two responses of each prompt: rows 0, 1 and 3, 4
    rows = [0, 1, 3, 4]
    inputs = heatmap_inputs(batch, out, token_text=lambda token: f"t{token}", rows=rows)
    labels = [f"row {r} · reward {float(batch['rewards'][r]):.1f}" for r in rows]
    heatmap = advantage_heatmap(**inputs, labels=labels, title="examples/heatmap.py")
    # With TensorBoard: SummaryWriter.add_image("advantage_heatmap", heatmap.image, step,
    # dataformats="HWC"); with a log_image logger: logger.log_image(key=..., images=[heatmap.image])
    print(f"image {heatmap.image.shape[1]}x{heatmap.image.shape[0]} pixels, advantage scale "
          f"±{heatmap.limit:.3f}")
    for cell in heatmap.cells:
        b, i = rows[cell.row], cell.position
        print(f"row {b} token {i} ({inputs['tokens'][cell.row][i]}): advantage "
              f"{float(inputs['advantages'][cell.row, i]):+.3f}, cell {cell.box}")
    if len(sys.argv) > 1:
        heatmap.figure.savefig(sys.argv[1])
        print(f"saved {sys.argv[1]}")


if __name__ == "__main__":
    main()
