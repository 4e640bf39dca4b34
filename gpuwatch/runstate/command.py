"""A person's own command (gpuwatch run) as the screen says it (pure).

``CommandView`` is what ``RunState.command_view`` gives: the command's line, why there
are no step metrics where there are none (NOT_TENSORFLOW, NO_TRAINING), why its input wait cannot be
measured; ``shell_text`` is its argv as a shell reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# What the screen says of a command that sends no step (a program that is not Python, or
# Python that never imports TensorFlow): only its processes and devices are watched.
NOT_TENSORFLOW = "no step metrics: not a TensorFlow program"
# ... and of a Python command that ended trying to import TensorFlow (or Keras) where its
# Python has none: a TensorFlow program all the same, in the wrong environment.
NO_TENSORFLOW_MODULE = ("no step metrics: the command's Python has no {module} "
                        "(install it there, or run the Python that has it)")
# ... and of a TensorFlow program whose hook saw no training loop run (a tf.data
# benchmark, a strategy tutorial's toy functions): no fit, no strategy.run step.
NO_TRAINING = "no training seen: no optimizer update ran (fit, a loop of its own)"


@dataclass(frozen=True, slots=True)
class CommandView:
    """A person's own command as the screen says it (``RunState.command_view``).

    ``line``: "script: python train.py · fit · MirroredStrategy" ("command:" until its hook
    speaks: maybe not Python at all); ``note``: why there are no step metrics ("not
    watched: ...", NOT_TENSORFLOW), None when they can come; ``input_wait``: "input wait:
    not measurable for this loop (...)", said where the figure would be, else None.
    """

    command: str  # the argv as a shell would read it
    kind: str  # "script" once its hook spoke, else "command"
    watched: tuple[str, ...] = ()  # the hook's loop and strategy, once seen
    note: str | None = None
    input_wait: str | None = None

    @property
    def head(self) -> str:
        return f"{self.kind}: "

    @property
    def tail(self) -> str:
        return "".join(f" · {part}" for part in self.watched)

    @property
    def line(self) -> str:
        return f"{self.head}{self.command}{self.tail}"


def missing_tensorflow(message: str | None) -> str | None:
    """The note for a command that ended on `No module named 'tensorflow'` (or 'keras',
    or a part of either): its crash cause says so; None for any other end."""
    import re

    found = re.search(r"No module named '(tensorflow|keras)[.'\w]*", message or "")
    return NO_TENSORFLOW_MODULE.format(module=found.group(1)) if found else None


def printable(text: str) -> str:
    """text with each character a terminal would act on (escapes, controls, line breaks)
    as "?": what a run's record says (a command, its output, a message) shown as it is."""
    return "".join(char if char.isprintable() else "?" for char in text)


def shell_text(argv: Sequence[str]) -> str:
    """argv as a shell would read it (shlex quoting), on one line of printable text."""
    import shlex

    return printable(" ".join(shlex.quote(arg) for arg in argv))
