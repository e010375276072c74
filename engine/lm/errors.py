"""The language-model package's one exception tree::

    LmError
    ├── DataError            text or tokens that cannot train a model (empty, binary, too short, ids
    │                        beyond the vocabulary); the message names the file and what to do
    ├── TokenizerMismatch    a tokenizer that differs from the experiment's (by its sha256)
    ├── ConfigError          a model whose sizes do not fit together or do not match the experiment's
    ├── ModelFileError       a model file (``lah export``'s) that cannot be read, whose tensors do not
    │                        fit its config, whose experts' digests differ, or that lacks its tokenizer
    └── LossNotFinite        the loss became NaN or inf at a step; the last good checkpoint is kept
        └── GradientNotFinite  a finite loss whose gradients are not (that step changes nothing)

Every one is the researcher's to fix, so the command line turns each into a sentence and exit status 2.
"""

from __future__ import annotations


class LmError(Exception):
    """Base of everything engine.lm raises."""


class DataError(LmError):
    pass


class TokenizerMismatch(LmError):
    pass


class ConfigError(LmError):
    pass


class ModelFileError(LmError):
    pass


class LossNotFinite(LmError):
    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"the loss is {loss} at step {step}: training stopped there")
        self.step, self.loss = step, loss


class GradientNotFinite(LossNotFinite):
    def __init__(self, step: int, loss: float, parameter: str) -> None:
        LmError.__init__(
            self,
            f"the gradient of {parameter} is not finite at step {step} (loss {loss:.4g}): "
            "training stopped there",
        )
        self.step, self.loss, self.parameter = step, loss, parameter
