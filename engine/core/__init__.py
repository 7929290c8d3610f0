"""The compiled step and its loop: towers, variable modes, losses, loss scaling,
precision, the loop's options and progress lines."""

__all__ = ["loop", "loss_scale", "losses", "on_device", "options", "outputs", "precision",
           "progress", "step", "variables"]
