"""``python -m lightning_adv fit --config configs/ppo.yaml`` (also ``validate``, ``test``,
``predict``), and ``python -m lightning_adv make-tiny --out DIR``: see
:mod:`lightning_adv.cli`."""

from lightning_adv.cli import main

if __name__ == "__main__":
    main()
