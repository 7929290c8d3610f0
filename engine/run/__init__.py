"""A run's life around the loop: the settings it picks, building the towers,
training them, checkpoints, signals, the non-finite guard, summaries
and the watchdog."""

__all__ = ["build", "checkpoint", "choices", "describe", "guard", "options", "outputs", "session",
           "signals", "summaries", "train", "watchdog", "watchers"]
