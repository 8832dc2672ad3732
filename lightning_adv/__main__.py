"""``python -m lightning_adv fit --config configs/ppo.yaml``"""

from lightning_adv.cli import main

if __name__ == "__main__":
    main()
