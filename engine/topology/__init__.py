"""Where things run: device names and placements (`devices`), the cluster
(`cluster`), process-wide set-up (`process`)."""

__all__ = ["cluster", "devices", "process", "splits"]
