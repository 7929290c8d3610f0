"""The data's own error, apart so that every data module can raise it."""

from engine.errors import UsageError

__all__ = ["DataError"]


class DataError(UsageError):
    """Data that cannot be read as asked; the message is one line."""
