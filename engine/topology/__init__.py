"""Where things run: device names and placements, host splits, the cluster."""
