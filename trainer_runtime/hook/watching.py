"""What each of the hook's patches needs of the Watch (watch.py), as Protocols.

watch.py makes the Watch and hands it to the patches (keras_patches.py, loops.py; fit.py
through keras_patches.py); they know it only by these, so none of them imports watch.py:
the dependency runs one way, watch -> patches -> this. mypy checks the real Watch against
them where watch.py hands it over. Typing only: nothing here runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol


class FitWatch(Protocol):
    """What fit.py's train function and per-batch callback need: the epoch, and each step."""

    epoch: int
    epoch_start: int | None
    flops_per_example: float | None

    def report(self, *, step_time_ms: float, input_wait_ms: float | None, examples: int,
               loss: float | None, lr: float | None, end: float,
               epoch: int | None) -> None: ...


class PendingSteps(Protocol):
    """The custom loops' step that waits for its loss (loops.CustomLoops)."""

    def flush_pending(self) -> None: ...


class Updates(Protocol):
    """The script's own updates (updates.PlainUpdates), as keras_patches.py hands them."""

    def apply(self, original: Callable[..., Any], optimizer: Any, *args: Any,
              **kwargs: Any) -> Any: ...

    def model_call(self, original: Callable[..., Any], model: Any, *args: Any,
                   **kwargs: Any) -> Any: ...


class KerasWatch(FitWatch, Protocol):
    """What keras_patches.py needs (and fit.py, which it hands the Watch to)."""

    keras_version: str
    hello_sent: bool
    step: int
    keras_depth: int
    applies: int
    applied_by: Any
    param_count: int
    stopped: bool
    on_max_steps: Callable[[], None] | None

    @property
    def loops(self) -> PendingSteps: ...

    @property
    def updates(self) -> Updates: ...

    def set_loop(self, loop: str, input_wait: str = "", message: str = "") -> None: ...

    def note_strategy(self, strategy: Any) -> None: ...

    def count_params(self, variables: Sequence[Any]) -> None: ...

    def send_hook(self) -> None: ...


class StepWatch(Protocol):
    """What both loop patches need (loops.py's CustomLoops, updates.py's PlainUpdates):
    the state they stand by on, the hook event, and each step they report (numbered on
    from `step`, which a restored optimizer's count sets before the hello)."""

    run_depth: int
    hello_sent: bool
    step: int
    flops_per_example: float | None
    tf: Any
    lock: threading.Lock
    message: str
    keras_depth: int
    stopped: bool

    @property
    def own_process(self) -> bool: ...

    def set_loop(self, loop: str, input_wait: str = "", message: str = "") -> None: ...

    def note_strategy(self, strategy: Any) -> None: ...

    def send_hook(self) -> None: ...

    def report(self, *, step_time_ms: float, input_wait_ms: float | None, examples: int,
               loss: float | None, lr: float | None, end: float,
               epoch: int | None) -> None: ...


class LoopsWatch(StepWatch, Protocol):
    """What loops.py's CustomLoops needs."""

    prefetch: Any
    emitter: Any
    applies: int
    applied_by: Any


class HostLoops(Protocol):
    """What updates.py needs of loops.py's CustomLoops: the host's wait in next() on a
    distributed iterator, and the end at max_steps."""

    eager_wait_s: float
    eager_fetch_start: float | None

    def flush_pending(self) -> None: ...

    def end_loop(self, *, eager: bool) -> None: ...


class UpdatesWatch(StepWatch, Protocol):
    """What updates.py's PlainUpdates needs."""

    loop: str
    input_wait: str

    @property
    def loops(self) -> HostLoops: ...
