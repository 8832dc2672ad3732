"""torchmetrics metrics of advantages, rewards and losses, synced across ranks."""
