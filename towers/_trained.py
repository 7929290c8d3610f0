"""What a `towers.Trainer` is once made: how it speaks (in Python terms; the
command line's in flags), its towers built on first use, and what they give:
`evaluate`, `save` and the model. `towers.trainer` adds making one and `fit`.
"""

from __future__ import annotations

import sys

from engine import errors
from engine.errors import UsageError
from engine.run import weights

__all__ = ["TrainerBase"]


class TrainerBase:
    """The built half of a Trainer (`towers.Trainer` documents it whole).

    Attributes it expects the Trainer to set: `stream`, `placement`,
    `options`, `info`, `watchdog`, `init_weights`, `check_reducer`,
    `checkpoint_dir`, `built` (None until `_build`).
    """

    # How messages tell the user to resume (the CLI's: its command line).
    _resume_hint = "fit(..., resume=True)"
    # What stops a run at its next safe point after a signal (the CLI's
    # engine.run.signals.GracefulStop); None: nothing does.
    _stop = None
    # Told the cluster tasks that stopped answering when a deadline passed
    # (engine.run.session.open_session's `on_lost`; the CLI's supervisor
    # restarts the run there); None: the run stops with its warning.
    _on_lost = None

    def _before_tensorflow(self) -> None:
        """Called once the arguments are checked, before TensorFlow starts
        (the command line imports it quietly here)."""

    def _say(self, message: str) -> None:
        print(message, file=self.stream, flush=True)

    def _voice(self, verbose: int):
        """How the run speaks (engine.core.progress.Voice): in Python terms."""
        from engine.core.progress import Voice

        return Voice(self.stream, verbose=verbose)

    def _warn(self, message: str) -> None:
        """Prints a one-line error about the run (a cluster task that stopped
        answering) on stderr, in Python terms."""
        sys.stdout.flush()
        print(f"error: {errors.render(message)}", file=sys.stderr, flush=True)

    def _resume_advice(self) -> str:
        """Where the run can go on from, for messages about a lost cluster."""
        import tensorflow as tf

        directory = self.checkpoint_dir
        latest = tf.train.latest_checkpoint(directory) if directory else None
        if latest is None:
            return "no checkpoint was saved" + ("" if directory else " (no <checkpoint_dir>)")
        return (f"the last checkpoint is {latest}; once every worker is up again, resume "
                f"with: {self._resume_hint}")

    def save(self, path: str, best: bool = False) -> str:
        """Writes the trained model where a user can load it without this
        package: `path` ending in `.keras` is a Keras model file
        (`keras.models.load_model(path)`; the zoo's models need nothing
        else, a model with layers of your own needs their classes), any
        other path a TensorFlow SavedModel for inference
        (`tf.saved_model.load(path).serve(images)`, or
        `keras.layers.TFSMLayer(path)`).

        Args:
          path: where to write.
          best: write the weights of the best checkpoint that `fit(...,
            keep_best=)` kept, not the latest; the trainer's own weights
            stay as they are.

        Returns:
          `path`.

        Raises:
          UsageError: nothing trained yet, no best checkpoint kept, or a
            path that cannot be written.
        """
        from engine.run.watchers import read_best
        from towers import _arguments

        _arguments.check(TrainerBase.save, locals())
        if self.built is None:
            raise UsageError("<save_model>: nothing is trained yet; call fit first")
        kept = read_best(self.checkpoint_dir) if best and self.checkpoint_dir else None
        if best and kept is None:
            raise UsageError("<best=True>: no best checkpoint was kept; fit with "
                             "<checkpoint_dir> and <keep_best> first")
        return weights.export(self.model, path, kept["path"] if best else None,
                              self.options.model.model_name)

    def evaluate(self, steps: int | None = None) -> dict[str, float]:
        """One pass over the held-out set (or `steps` batches per tower).

        Args:
          steps: batches per tower; default: the whole held-out set.

        Returns:
          eval_loss, eval_accuracy and eval_samples (and with top-k,
          `eval_top5_accuracy` for k=5).

        Raises:
          UsageError: the data has no held-out set.
        """
        from engine import data as data_lib
        from towers import _arguments

        _arguments.check(TrainerBase.evaluate, locals())

        self._build(self.options)
        held_out = self.built.held_out
        if held_out is None:
            raise UsageError("<data> has no held-out set to evaluate on")
        if steps is None:
            steps = data_lib.eval_batches(held_out.size, held_out.batch_size,
                                          held_out.num_towers)
        return held_out.evaluate(self.built.step, steps)

    @property
    def model(self):
        """The Keras model (tower 0's copy with replicated variables); None
        until the towers are built."""
        return None if self.built is None else self.built.step.model

    def _build(self, options) -> None:
        if self.built is not None:
            return
        from engine.run import plan

        self.built = plan.build(self.placement, options, self.info, self.watchdog,
                                init_weights=self.init_weights,
                                check_reducer=self.check_reducer, say=self._say)
        self._checkpointing = options.data.checkpointing
