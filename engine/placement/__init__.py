"""The placement log: capture where every op ran (`log`, with `reasons` for
the ops that moved), time the step (`profile`, `timeline`), report it
(`report`, `summary`, `analysis`, `overlap`), draw it (`render`, `trace`, `tensorboard`) and hold it
to budgets (`budgets`)."""

__all__ = ["analysis", "budgets", "log", "overlap", "profile", "reasons", "render", "report",
           "summary", "tensorboard", "timeline", "trace"]
