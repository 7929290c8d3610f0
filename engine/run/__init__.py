"""A run's life around the loop: the trainer, checkpoints, signals, the non-finite guard,
summaries, progress and the watchdog."""
