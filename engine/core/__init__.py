"""The compiled step and its loop: towers, variable modes, losses, loss scaling,
precision, name scopes."""

__all__ = ["loop", "loss_scale", "losses", "on_device", "options", "precision", "scopes", "step",
           "variables"]
