"""What a run shows: step metrics, sample text, advantage heatmaps, held-out evaluation."""
