"""The placement log: capture where every op ran (`log`), report it (`report`),
draw it (`render`)."""

__all__ = ["log", "render", "report"]
