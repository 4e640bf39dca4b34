"""Wire format shared by trainer, supervisor and dashboard: NDJSON frames over AF_UNIX.

Stdlib only: this module is imported by both sides of every socket, so it must
not pull in TensorFlow, Textual or gpuwatch.

Every frame is one JSON object on one line, with ``"v"`` (the protocol version,
an integer) and ``"type"``. A frame longer than ``MAX_FRAME_BYTES``, one that is
not UTF-8, not JSON, not an object, nested deeper than ``MAX_NESTING_DEPTH``, or
lacks ``v``/``type`` is a ``ProtocolError`` (every decode failure is one, never
anything else); the reader of a connection counts it and closes that connection,
never crashes.

Frame types
-----------
trainer -> supervisor (the trainer's telemetry socket):
  hello       The trainer is built and about to train.
              attempt (int): the attempt it belongs to (1, 2, ...)
              pid (int): the trainer's process id
              tf_version (str): TensorFlow's version
              replicas (int): replicas in sync
              device_kind (str): "gpu" or "cpu" (logical CPU replicas)
              devices (list[str]): the replica devices
              param_count (int): trainable parameters
              param_bytes (int): their bytes
              global_batch_size (int): examples per optimizer update
              accumulation_steps (int): micro-steps per update
              per_replica_batch (int): examples per replica per micro-step
              start_step (int): optimizer steps before this attempt
              start_micro_step (int): micro-steps before this attempt
              worker (int): the worker that sent it (0 = chief)
              workers (int): workers in the cluster (1: one host)
              host (str): the worker's host name (its node's Slurm name in a Slurm
                step: SLURMD_NODENAME)
              flops_per_example (float | None): FLOPs of one example's forward and
                backward pass (matmuls, convs, einsums), counted in the traced update;
                null: not counted
  step        One optimizer update as the trainer measured it (t: when it ended).
              attempt (int): the attempt it belongs to (1, 2, ...)
              step (int): optimizer steps so far, counted across attempts
              micro_step (int): micro-batches so far
              epoch (int): passes over the data so far (0 for a factory's)
              loss (float | None): mean loss of the update (null if not finite)
              lr (float | None): the learning rate it applied (null: not known, a
                script's loop)
              examples (int): examples trained on, counted in the graph
              step_time_ms (float): wall time of the whole update
              input_wait_ms (float | None): host time blocked on the input iterator
                (null: not measurable, the hook event says why)
              grad_sync_bytes (float): estimated all-reduce bytes in this update
              position (int | None): examples trained on so far, all attempts
              dropped (int): telemetry frames dropped so far
              worker (int): the worker that sent it (0 = chief)
              compute_ms (float | None): batch in hand to local gradients ready,
                before the all-reduce
              sync_ms (float | None): gradient all-reduce: the last local replica's
                gradients ready to the reduced gradients in hand (holds waiting for
                slower workers, and on a GPU backward work still queued); null: not
                timed apart
              update_ms (float | None): optimizer update: reduced gradients in hand to
                the new weights written
  checkpoint  A checkpoint was written.
              attempt (int): the attempt it belongs to (1, 2, ...)
              step (int): the optimizer step it holds
              micro_step (int): the micro-step it holds
              path (str): its path prefix
              seconds (float): time the save took
              worker (int): the worker that sent it (0 = chief)
  resume      The attempt continues from a checkpoint.
              attempt (int): the attempt it belongs to (1, 2, ...)
              from_step (int): the checkpoint's optimizer step
              from_micro_step (int): its micro-step
              checkpoint (str | None): its path
              position (int): examples trained on before it
              data_order (str): "continued" or "restarted"
              data_note (str): why the data order restarted
              lost_steps (int | None): added by the supervisor: steps since the
                checkpoint
              worker (int): the worker that sent it (0 = chief)
  reconfigured The trainer applied (or refused) live settings in the same process.
              attempt (int): the attempt it belongs to (1, 2, ...)
              id (int): the reconfigure request's id
              ok (bool): whether the new settings now apply
              step (int): the last step under the old settings; the new apply from
                step + 1
              changed (list[str]): the dotted keys that changed
              seconds (float): time the switch took
              message (str): why not (ok false), or a note, one line
              worker (int): the worker that sent it (0 = chief)
  done        The trainer is ending after a checkpoint.
              attempt (int): the attempt it belongs to (1, 2, ...)
              reason (str): "max_steps", "epochs", "sigterm", "socket_lost", or a
                script's "exited"
              step (int): the last optimizer step
              worker (int): the worker that sent it (0 = chief)
  error       The trainer cannot go on; the message is its root cause, one line.
              attempt (int): the attempt it belongs to (1, 2, ...)
              kind (str): "config", "factory" or "runtime"
              message (str): one line
              worker (int): the worker that sent it (0 = chief)
  hook        What gpuwatch's hook in a person's own command (`gpuwatch run`)
              instruments, or why
              attempt (int): the attempt it belongs to (1, 2, ...)
              installed (bool): the hook runs in the command's Python
              message (str): why not, or what it watches: one line
              tensorflow (bool): the command imported TensorFlow
              keras_version (str): Keras' version, once imported
              loop (str): "fit", "fit (callback)", "strategy.run (tf.function)",
                "strategy.run (eager)"; "": no training loop seen yet
              input_wait (str): "" measured, else why it is not measurable
              strategy (str): the strategy's class, once seen
              worker (int): the worker that sent it (0 = chief)
agent -> supervisor (past 8 workers, instead of a worker's steps but the chief's):
  steps       A worker's updates over about a second, summed by its agent: past
              attempt (int): the attempt it belongs to (1, 2, ...)
              worker (int): the worker whose steps these are
              first_step (int): the first update it covers
              last_step (int): the last update it covers
              count (int): the updates it covers
              epoch (int): the last update's epoch
              examples (int): examples trained on in them
              loss (float | None): the last finite loss among them (null: none)
              position (int | None): the last update's position
              dropped (int): telemetry frames dropped so far
              step_time_ms (list[float]): step time: [min, median, max, sum] ms over
                its steps
              input_wait_ms (list[float] | None): input wait: [min, median, max, sum]
                ms over its steps (null: not measured in all)
              compute_ms (list[float] | None): compute: [min, median, max, sum] ms
                over its steps (null: not measured in all)
              sync_ms (list[float] | None): gradient all-reduce: [min, median, max,
                sum] ms over its steps (null: not measured in all)
              update_ms (list[float] | None): optimizer update: [min, median, max,
                sum] ms over its steps (null: not measured in all)
              breakdown_ms (list[float] | None): [step, input, compute, sync, update]
                ms summed over its steps that have a breakdown (null: none has)
supervisor -> dashboard, besides every trainer and agent event relayed:
  run         The run: the first line of events.jsonl (attempt 0).
              run_id (str): the run's id
              name (str): the config's name
              config_path (str): the config as given
              supervisor_pid (int): the supervisor's process id
              host (str): where it runs
              settings (dict[str, Any]): the validated config
              created (float | None): when the run was made
  attempt     An attempt starts with these settings.
              attempt (int): the attempt it belongs to (1, 2, ...)
              settings (dict[str, Any]): the full validated config
              fresh (bool): whether it ignores checkpoints
              reason (str): "start", "relaunch", "live", "resume" or "scale"
              config_path (str): attempt-N.yaml in the run directory
  scale       The run is a scaling probe: a short fresh attempt at each device count,
              in order.
              counts (list[int]): the device counts, in the order they run
              unit (str): "replicas", or "workers" for a cluster
              mode (str): "weak" (the per-replica batch kept) or "strong" (the global
                batch kept)
              steps (int): optimizer steps of each attempt, warm-up included
              cores (int | None): CPU cores the supervisor's host lets its trainers
                use (logical CPU replicas beyond them share cores)
  status      The run's status changed (see STATUSES).
              attempt (int): the attempt it belongs to (1, 2, ...)
              status (str): one of STATUSES
              exit_code (int | None): the trainer's, if it exited
              signal (str | None): the signal that ended it
              message (str | None): what happened, one line
              log_tail (list[str]): the trainer log's last lines, on a crash
              worker (int | None): the worker whose exit set this status, in a cluster
  sample      One device sample of the host (1 Hz).
              host (dict[str, Any]): cpu_pct, mem_used_bytes, ...
              gpus (list[dict[str, Any]]): one per GPU
              nvml (str | None): null when NVML works, else why it does not
              worker (int): the worker whose host it samples
              gpu_summary (dict[str, Any] | None): past 8 workers, a worker's (not the
                chief's) GPUs summed, gpus then empty: count, lost, util_gpu_pct [min,
                mean, max], mem_used_bytes, mem_total_bytes, pcie_bytes_per_s,
                nvlink_bytes_per_s
Every frame carries "v" and "type"; "t" is the sender's clock (a step's: when it
ended); the supervisor adds "seq", the event's line number in events.jsonl.
supervisor -> dashboard, replies:
  ack / err   id (the command's), message (err only), and any result fields
supervisor -> dashboard, first, when a subscribe asked for a snapshot it has:
  snapshot    seq (the last event the state folds), schema (its format), part and
              parts (0-based index and count), data (that part of the snapshot text);
              the parts come in order before any event; the client joins them
              (SnapshotParts) into one frame whose data is the whole text

dashboard -> supervisor (commands; each answered by ack or err). Every field is
checked by type and range; an unknown command or field, or a value of the wrong
kind (1 is not true, true is not 1), is answered err and changes nothing.
  (any)       fields every command may carry
              id: a string of at most 128 characters, an integer (-9007199254740991 to
                9007199254740991) or null; default null; the reply echoes it (when it
                is valid)
  subscribe   Send every recorded event with seq >= from_seq, then live ones.
              from_seq: an integer from 0 to 9007199254740991; default 0
              snapshot: a string of 1 to 128 characters or null; default null; the
                snapshot format the client reads (gpuwatch.snapshot.schema_id); when
                the supervisor has one of that format at seq S >= from_seq, it sends
                it first (snapshot frames) and then the events from S + 1; the ack
                says snapshot_seq
              dashboard: true or false; default false; true: a person watches (the
                dashboard); while one does and the run is live, a spare trainer waits
                for a relaunch
  relaunch    Stop the trainer, start a new attempt with these settings (resumes from
              checkpoint).
              overrides: an object of at most 64 dotted keys (like "data.prefetch") to
                JSON values; default {}; validated as the config is
              fresh: true or false; default false; only a literal true starts from
                step 0, discarding progress
              live: true or false; default true; false: always a full relaunch (key R)
  stop        Stop the trainer (it checkpoints first) and the run.
  status      The reply carries the current status, attempt, step, pids and counters.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from types import MappingProxyType
from typing import Any, ClassVar, TypeAlias

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 1 << 20
# The deepest a frame may nest (the frame object itself is level 1). Real frames nest
# 4-6 levels (settings -> model -> kwargs -> ...); the limit sits far below Python's
# recursion limit, so nothing that walks a frame later (json.dumps when relaying,
# pydantic, copy) can blow the stack on one.
MAX_NESTING_DEPTH = 64

# Bounds on command fields.
MAX_WIRE_INT = 2**53 - 1  # the largest integer every JSON reader holds exactly
MAX_ID_CHARS = 128
MAX_OVERRIDES = 64
MAX_OVERRIDE_KEY_CHARS = 128

# "relaunching": the old attempt stopped and a new one is about to start (not terminal).
STATUSES = (
    "starting",
    "running",
    "stopping",
    "relaunching",
    "stopped",
    "finished",
    "crashed",
    "lost",
)
TERMINAL_STATUSES = frozenset({"stopped", "finished", "crashed", "lost"})
# The terminal statuses in which the run failed: shown with why, and the log's tail.
FAILED_STATUSES = frozenset({"crashed", "lost"})


def host_name() -> str:
    """This host as a hello and an agent name it: in a Slurm step its node's Slurm name.

    That is what squeue and sinfo show, what the others dial, and on a host that runs
    several emulated nodes (slurmd's MULTIPLE_SLURMD) the only name that tells them apart.
    """
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


class ProtocolError(ValueError):
    """A frame that cannot be accepted: too long, not UTF-8, not JSON, wrong shape."""


class InvalidCommand(ProtocolError):
    """A well-formed frame that is not a valid command; the message names command and field.

    ``command_id`` is the frame's id when that id is itself valid (the ``err`` reply
    echoes it), else None. ``field`` names the offending field ("v", "type", ...).
    """

    def __init__(
        self, message: str, command_id: CommandId = None, field_name: str | None = None
    ) -> None:
        super().__init__(message)
        self.command_id = command_id
        self.field = field_name


# -- frames ---------------------------------------------------------------------------


def encode(frame_type: str, **fields: Any) -> bytes:
    """One frame as bytes, newline included."""
    frame = {"v": PROTOCOL_VERSION, "type": frame_type, **fields}
    return encode_frame(frame)


def encode_frame(frame: dict[str, Any]) -> bytes:
    """Serialise an already-built frame dict (must carry v and type).

    Anything the reader would refuse is refused here, as a ProtocolError (a
    ValueError): NaN, values JSON cannot hold, nesting over the limit, size.
    """
    try:
        data = json.dumps(frame, separators=(",", ":"), allow_nan=False, default=_jsonable)
    except RecursionError:
        raise ProtocolError(f"frame nests deeper than {MAX_NESTING_DEPTH} levels") from None
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"frame cannot be sent as JSON ({_one_line(exc)})") from None
    if _may_nest_deeper_than(data, MAX_NESTING_DEPTH) and _nests_deeper_than(
        frame, MAX_NESTING_DEPTH
    ):
        raise ProtocolError(f"frame nests deeper than {MAX_NESTING_DEPTH} levels")
    out = data.encode("utf-8") + b"\n"
    if len(out) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(out)} bytes is over the {MAX_FRAME_BYTES} limit")
    return out


def _jsonable(value: Any) -> Any:
    # numpy scalars and the like expose item(); anything else becomes its repr.
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    return repr(value)


def decode(line: bytes) -> dict[str, Any]:
    """Parse one line (with or without its newline) into a frame dict.

    Raises ProtocolError, and only that, for anything it cannot accept.
    """
    if len(line) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(line)} bytes is over the {MAX_FRAME_BYTES} limit")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"frame is not UTF-8 ({exc.reason})") from None
    try:
        frame = _loads(text)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"frame is not JSON ({exc.msg})") from None
    except RecursionError:
        raise ProtocolError(f"frame nests deeper than {MAX_NESTING_DEPTH} levels") from None
    except Exception as exc:  # e.g. ValueError for an integer of over 4300 digits
        raise ProtocolError(f"frame is not acceptable JSON ({_one_line(exc)})") from None
    if not isinstance(frame, dict):
        raise ProtocolError("frame is not a JSON object")
    if _may_nest_deeper_than(text, MAX_NESTING_DEPTH) and _nests_deeper_than(
        frame, MAX_NESTING_DEPTH
    ):
        raise ProtocolError(f"frame nests deeper than {MAX_NESTING_DEPTH} levels")
    version = frame.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError(f"frame has protocol version {_show(version)}, want {PROTOCOL_VERSION}")
    if not isinstance(frame.get("type"), str):
        raise ProtocolError("frame has no string 'type'")
    return frame


# json.loads without its two whitespace matches and its checks around the scan: json's
# own scanner, as json.loads's decoder has it (the same default settings), called directly
# (JSONDecoder.__init__ sets scan_once; typeshed does not list it).
_scan_once: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _loads(text: str) -> Any:
    """json.loads(text): the same value, or the same exception from json.loads itself.

    The common frame is one JSON value from its first character to its last; that is
    read by the scanner alone. Anything else (leading or trailing whitespace or text, a
    byte order mark, bad JSON, deep nesting) goes to json.loads, which reads it again
    and raises exactly what it always did.
    """
    try:
        value, end = _scan_once(text, 0)
    except Exception:  # StopIteration, JSONDecodeError, RecursionError, ValueError, ...
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


def _may_nest_deeper_than(text: str, limit: int) -> bool:
    # Nesting needs an opening bracket per level, so a text with few of them (a flat
    # step frame has one) cannot be too deep: two C-speed counts instead of a walk.
    return text.count("{") + text.count("[") > limit


def _nests_deeper_than(value: Any, limit: int) -> bool:
    """True when lists/dicts in value nest more than limit levels (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, (dict, list, tuple)):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


class FrameBuffer:
    """Splits a byte stream into frames; enforces the size limit before a newline arrives."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_frame_bytes

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Add bytes; return the complete frames they finish. Raises ProtocolError.

        On a bad line the lines before it are lost with the exception, the bad line is
        gone and the lines after it stay in the buffer, as if read one at a time.
        """
        self._buf += data
        frames: list[dict[str, Any]] = []
        if self._buf.find(b"\n") >= 0:
            # One split for all the lines a chunk completes (a reader that is behind gets
            # hundreds at once), not a find, a copy and a delete for each.
            *lines, rest = bytes(self._buf).split(b"\n")
            self._buf = bytearray(rest)
            for index, line in enumerate(lines):
                try:
                    if len(line) > self._max:
                        raise ProtocolError(
                            f"frame of {len(line)} bytes is over the {self._max} limit"
                        )
                    if line.strip():
                        frames.append(decode(line))
                except ProtocolError:
                    self._buf = bytearray(b"\n".join([*lines[index + 1 :], rest]))
                    raise
        if len(self._buf) > self._max:
            raise ProtocolError(
                f"frame over the {self._max} byte limit (no newline after "
                f"{len(self._buf)} bytes)"
            )
        return frames

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)


# -- commands: dashboard -> supervisor ----------------------------------------------------
#
# Each command is declared once, as a frozen dataclass whose fields carry their wire
# kind (what JSON they accept). parse_command, command_frame and command_reference
# (the text in this module's docstring and in docs/internals.md) all read these
# declarations; nothing else describes a command.

CommandId: TypeAlias = str | int | None


class _Refused(Exception):
    """A field's value is refused; ``reason`` completes "<command>: <field> ..."."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class WireKind:
    """What one command field accepts: the words for it, and the check that enforces them.

    ``check`` returns the value to keep (of exactly the declared Python type) or
    raises _Refused.
    """

    describe: str
    check: Callable[[Any], Any]

    def refuse(self, value: Any) -> _Refused:
        return _Refused(f"must be {self.describe} (got {_show(value)})")


def _check_bool(value: Any) -> bool:
    # Only JSON true/false: not 1, not "yes", not "no" (which bool() would call true).
    if value is True or value is False:
        return bool(value)
    raise BOOL.refuse(value)


def _check_seq(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_WIRE_INT:
        return int(value)
    raise SEQ.refuse(value)


def _check_snapshot_format(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS:
        return str(value)
    raise SNAPSHOT_FORMAT.refuse(value)


def _check_id(value: Any) -> CommandId:
    if value is None:
        return None
    if isinstance(value, str) and len(value) <= MAX_ID_CHARS:
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_WIRE_INT:
        return int(value)
    raise COMMAND_ID.refuse(value)


_DOTTED_KEY = re.compile(r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*")


def _check_overrides(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise OVERRIDES.refuse(value)
    if len(value) > MAX_OVERRIDES:
        raise _Refused(f"has {len(value)} keys; at most {MAX_OVERRIDES}")
    checked: dict[str, Any] = {}
    for key, item in value.items():
        if (
            not isinstance(key, str)
            or len(key) > MAX_OVERRIDE_KEY_CHARS
            or not _DOTTED_KEY.fullmatch(key)
        ):
            raise _Refused(
                f"key {_show(key)} is not a dotted key (names of letters, digits and _ "
                f"between dots, at most {MAX_OVERRIDE_KEY_CHARS} characters)"
            )
        try:
            # Level 3: inside the frame (1) and the overrides object (2), as on the wire.
            checked[str(key)] = _json_value(item, 3)
        except _Refused as exc:
            raise _Refused(f"[{_show(key)}] {exc.reason}") from None
    return MappingProxyType(checked)


def _json_value(value: Any, depth: int) -> Any:
    """A copy of value made of JSON types only (the frame nests at most MAX_NESTING_DEPTH)."""
    if depth > MAX_NESTING_DEPTH:
        raise _Refused(f"nests deeper than {MAX_NESTING_DEPTH} levels")
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and math.isfinite(value):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_json_value(item, depth + 1) for item in value]
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Refused(f"must be a JSON value (got an object key {_show(key)})")
            out[str(key)] = _json_value(item, depth + 1)
        return out
    raise _Refused(f"must be a JSON value (got {_show(value)})")


BOOL = WireKind("true or false", _check_bool)
SEQ = WireKind(f"an integer from 0 to {MAX_WIRE_INT}", _check_seq)
COMMAND_ID = WireKind(
    f"a string of at most {MAX_ID_CHARS} characters, an integer "
    f"(-{MAX_WIRE_INT} to {MAX_WIRE_INT}) or null",
    _check_id,
)
SNAPSHOT_FORMAT = WireKind(
    f"a string of 1 to {MAX_ID_CHARS} characters or null", _check_snapshot_format
)
OVERRIDES = WireKind(
    f"an object of at most {MAX_OVERRIDES} dotted keys (like \"data.prefetch\") "
    "to JSON values",
    _check_overrides,
)


def _wire(kind: WireKind, note: str = "") -> dict[str, Any]:
    """A command field's metadata: its wire kind, and a note for the reference."""
    return {"kind": kind, "note": note}


@dataclass(frozen=True, kw_only=True)
class Command:
    """Base of the commands; ``TYPE`` is the frame type, the docstring's first line its summary."""

    TYPE: ClassVar[str] = ""
    id: CommandId = field(
        default=None, metadata=_wire(COMMAND_ID, "the reply echoes it (when it is valid)")
    )


@dataclass(frozen=True, kw_only=True)
class Subscribe(Command):
    """Send every recorded event with seq >= from_seq, then live ones."""

    TYPE: ClassVar[str] = "subscribe"
    from_seq: int = field(default=0, metadata=_wire(SEQ))
    snapshot: str | None = field(
        default=None,
        metadata=_wire(
            SNAPSHOT_FORMAT,
            "the snapshot format the client reads (gpuwatch.snapshot.schema_id); when the "
            "supervisor has one of that format at seq S >= from_seq, it sends it first "
            "(snapshot frames) and then the events from S + 1; the ack says snapshot_seq",
        ),
    )
    dashboard: bool = field(
        default=False,
        metadata=_wire(
            BOOL,
            "true: a person watches (the dashboard); while one does and the run is live, "
            "a spare trainer waits for a relaunch",
        ),
    )


@dataclass(frozen=True, kw_only=True)
class Relaunch(Command):
    """Stop the trainer, start a new attempt with these settings (resumes from checkpoint)."""

    TYPE: ClassVar[str] = "relaunch"
    overrides: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({}),
        metadata=_wire(OVERRIDES, "validated as the config is"),
    )
    fresh: bool = field(
        default=False,
        metadata=_wire(BOOL, "only a literal true starts from step 0, discarding progress"),
    )
    live: bool = field(
        default=True, metadata=_wire(BOOL, "false: always a full relaunch (key R)")
    )


@dataclass(frozen=True, kw_only=True)
class Stop(Command):
    """Stop the trainer (it checkpoints first) and the run."""

    TYPE: ClassVar[str] = "stop"


@dataclass(frozen=True, kw_only=True)
class Status(Command):
    """The reply carries the current status, attempt, step, pids and counters."""

    TYPE: ClassVar[str] = "status"


COMMANDS: Mapping[str, type[Command]] = MappingProxyType(
    {cls.TYPE: cls for cls in (Subscribe, Relaunch, Stop, Status)}
)
_ENVELOPE = ("v", "type")
_FIELDS: Mapping[str, Mapping[str, WireKind]] = MappingProxyType(
    {
        name: MappingProxyType({f.name: f.metadata["kind"] for f in fields(cls)})
        for name, cls in COMMANDS.items()
    }
)


def parse_command(frame: Any) -> Command:
    """The command a decoded frame carries, every field checked; else InvalidCommand.

    Strict: v must be the integer PROTOCOL_VERSION, type a known command, every
    other key a field of that command with a value of its kind. Raises
    InvalidCommand (a ProtocolError) and nothing else, with a one-line message
    naming the command and the field.
    """
    if not isinstance(frame, Mapping):
        raise InvalidCommand(f"a command must be a JSON object (got {_show(frame)})")
    command_id = reply_id(frame)
    frame_type = frame.get("type")
    cls = COMMANDS.get(frame_type) if isinstance(frame_type, str) else None
    name = cls.TYPE if cls is not None else "command"
    version = frame.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise InvalidCommand(
            f"{name}: v must be {PROTOCOL_VERSION} (got {_show(version)})", command_id, "v"
        )
    if cls is None:
        raise InvalidCommand(
            f"command: type must be one of {', '.join(COMMANDS)} (got {_show(frame_type)})",
            command_id,
            "type",
        )
    kinds = _FIELDS[name]
    for key in frame:
        if key not in _ENVELOPE and key not in kinds:
            raise InvalidCommand(
                f"{name}: unknown field {_show(key)} ({name} takes {', '.join(kinds)})",
                command_id,
                key if isinstance(key, str) else None,
            )
    values: dict[str, Any] = {}
    for field_name, kind in kinds.items():
        if field_name in frame:
            try:
                values[field_name] = kind.check(frame[field_name])
            except _Refused as exc:
                raise InvalidCommand(
                    f"{name}: {field_name}{'' if exc.reason.startswith('[') else ' '}"
                    f"{exc.reason}",
                    command_id,
                    field_name,
                ) from None
    return cls(**values)


def reply_id(frame: Mapping[str, Any]) -> CommandId:
    """The id a reply to this frame echoes: the frame's own, when valid; else None."""
    try:
        return _check_id(frame.get("id"))
    except _Refused:
        return None


def build_command(frame_type: str, /, **values: Any) -> Command:
    """A command from a type and field values, checked exactly as the supervisor checks it."""
    return parse_command({"v": PROTOCOL_VERSION, "type": frame_type, **values})


def command_frame(command: Command) -> dict[str, Any]:
    """The frame dict of a command: envelope, then every field (id only when set)."""
    frame: dict[str, Any] = {"v": PROTOCOL_VERSION, "type": command.TYPE}
    for f in fields(command):
        value = getattr(command, f.name)
        if f.name == "id" and value is None:
            continue
        frame[f.name] = dict(value) if isinstance(value, Mapping) else value
    return frame


def encode_command(command: Command) -> bytes:
    """One command frame as bytes, newline included."""
    return encode_frame(command_frame(command))


def command_reference(width: int = 86) -> str:
    """The commands and their fields as text, generated from the declarations.

    This module's docstring and docs/internals.md carry this text; a test checks
    that they still match it.
    """
    lines = [
        "dashboard -> supervisor (commands; each answered by ack or err). Every field is",
        "checked by type and range; an unknown command or field, or a value of the wrong",
        "kind (1 is not true, true is not 1), is answered err and changes nothing.",
    ]
    common = {f.name for f in fields(Command)}
    declared: list[type[Command]] = [Command, *COMMANDS.values()]
    for cls in declared:
        if cls is Command:
            lines.append("  (any)       fields every command may carry")
        else:
            summary = (cls.__doc__ or "").strip().splitlines()[0]
            lines.extend(
                textwrap.wrap(
                    f"{cls.TYPE:<11} {summary}",
                    width,
                    initial_indent="  ",
                    subsequent_indent=" " * 14,
                )
            )
        for f in fields(cls):
            if cls is not Command and f.name in common:
                continue
            kind: WireKind = f.metadata["kind"]
            text = f"{f.name}: {kind.describe}; default {_default_text(f)}"
            if f.metadata["note"]:
                text += f"; {f.metadata['note']}"
            lines.extend(
                textwrap.wrap(
                    text, width, initial_indent=" " * 14, subsequent_indent=" " * 16
                )
            )
    return "\n".join(lines)


def _default_text(f: Any) -> str:
    default = f.default_factory() if f.default is MISSING else f.default
    return json.dumps(dict(default) if isinstance(default, Mapping) else default)


def _show(value: Any) -> str:
    """A short, one-line JSON-ish rendering of a refused value, for messages."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        bits = value.bit_length()
        return str(value) if bits <= 128 else f"an integer of {bits} bits"
    if isinstance(value, float):
        return json.dumps(value) if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value[:60]) + ("..." if len(value) > 60 else "")
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return f"a {type(value).__name__}"


# -- events: trainer -> supervisor -> dashboards --------------------------------------
#
# Each event is declared once, as a frozen dataclass: its fields, their Python types
# (checked on decode) and a note each. The envelope ("v", "type", "seq", "t") is added
# by event_frame and read by parse_event, and nowhere else; "seq" is the supervisor's
# (the line number in events.jsonl), "t" the sender's clock. event_reference() is the
# text of this module's docstring section on events, generated from the declarations.

ENVELOPE = ("v", "type", "seq", "t")


def _note(text: str) -> dict[str, Any]:
    return {"note": text}


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of the events; ``TYPE`` is the frame type, ``FROM`` who sends it."""

    TYPE: ClassVar[str] = ""
    FROM: ClassVar[str] = ""


def _attempt() -> Any:
    return field(metadata=_note("the attempt it belongs to (1, 2, ...)"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello(Event):
    """The trainer is built and about to train."""

    TYPE: ClassVar[str] = "hello"
    FROM: ClassVar[str] = "trainer"
    attempt: int = _attempt()
    pid: int = field(metadata=_note("the trainer's process id"))
    tf_version: str = field(metadata=_note("TensorFlow's version"))
    replicas: int = field(metadata=_note("replicas in sync"))
    device_kind: str = field(metadata=_note('"gpu" or "cpu" (logical CPU replicas)'))
    devices: list[str] = field(metadata=_note("the replica devices"))
    param_count: int = field(metadata=_note("trainable parameters"))
    param_bytes: int = field(metadata=_note("their bytes"))
    global_batch_size: int = field(metadata=_note("examples per optimizer update"))
    accumulation_steps: int = field(metadata=_note("micro-steps per update"))
    per_replica_batch: int = field(metadata=_note("examples per replica per micro-step"))
    start_step: int = field(metadata=_note("optimizer steps before this attempt"))
    start_micro_step: int = field(metadata=_note("micro-steps before this attempt"))
    worker: int = field(default=0, metadata=_note("the worker that sent it (0 = chief)"))
    workers: int = field(default=1, metadata=_note("workers in the cluster (1: one host)"))
    host: str = field(default="", metadata=_note(
        "the worker's host name (its node's Slurm name in a Slurm step: SLURMD_NODENAME)"))
    flops_per_example: float | None = field(
        default=None,
        metadata=_note("FLOPs of one example's forward and backward pass (matmuls, convs, "
                       "einsums), counted in the traced update; null: not counted"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Step(Event):
    """One optimizer update as the trainer measured it (t: when it ended)."""

    TYPE: ClassVar[str] = "step"
    FROM: ClassVar[str] = "trainer"
    attempt: int = _attempt()
    step: int = field(metadata=_note("optimizer steps so far, counted across attempts"))
    micro_step: int = field(metadata=_note("micro-batches so far"))
    epoch: int = field(metadata=_note("passes over the data so far (0 for a factory's)"))
    loss: float | None = field(metadata=_note("mean loss of the update (null if not finite)"))
    lr: float | None = field(
        metadata=_note("the learning rate it applied (null: not known, a script's loop)")
    )
    examples: int = field(metadata=_note("examples trained on, counted in the graph"))
    step_time_ms: float = field(metadata=_note("wall time of the whole update"))
    input_wait_ms: float | None = field(
        metadata=_note("host time blocked on the input iterator (null: not measurable, "
                       "the hook event says why)")
    )
    grad_sync_bytes: float = field(metadata=_note("estimated all-reduce bytes in this update"))
    position: int | None = field(
        default=None, metadata=_note("examples trained on so far, all attempts")
    )
    dropped: int = field(default=0, metadata=_note("telemetry frames dropped so far"))
    worker: int = field(default=0, metadata=_note("the worker that sent it (0 = chief)"))
    compute_ms: float | None = field(
        default=None,
        metadata=_note("batch in hand to local gradients ready, before the all-reduce"),
    )
    sync_ms: float | None = field(
        default=None,
        metadata=_note(
            "gradient all-reduce: the last local replica's gradients ready to the reduced "
            "gradients in hand (holds waiting for slower workers, and on a GPU backward "
            "work still queued); null: not timed apart"
        ),
    )
    update_ms: float | None = field(
        default=None,
        metadata=_note("optimizer update: reduced gradients in hand to the new weights written"),
    )

    @property
    def examples_per_s(self) -> float | None:
        return per_second(self.examples, self.step_time_ms)

    @property
    def input_wait_pct(self) -> float | None:
        if self.input_wait_ms is None:
            return None
        return input_wait_pct(self.input_wait_ms, self.step_time_ms)

    @property
    def breakdown(self) -> Breakdown | None:
        if self.input_wait_ms is None:
            return None
        return breakdown(self.step_time_ms, self.input_wait_ms, self.compute_ms, self.sync_ms,
                         self.update_ms)


# More workers than this: every worker but the chief sends StepSummary, not its steps.
SUMMARY_PAST_WORKERS = 8
# A StepSummary's spread of one figure over its steps: [min, median, max, sum], in ms.
SPREAD = ("min", "median", "max", "sum")


_SPREAD_NOTE = ": [min, median, max, sum] ms over its steps (null: not measured in all)"


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSummary(Event):
    """A worker's updates over about a second, summed by its agent: past
    SUMMARY_PAST_WORKERS workers, every worker but the chief sends these instead of its
    steps once its first WARMUP_STEPS steps of an attempt have gone as steps (t: when its
    last step ended). Sent at once, not at the second's end, when a step falls behind
    (FALLING_BEHIND times the last summary's median) and before any other event."""

    TYPE: ClassVar[str] = "steps"
    FROM: ClassVar[str] = "agent"
    attempt: int = _attempt()
    worker: int = field(default=0, metadata=_note("the worker whose steps these are"))
    first_step: int = field(metadata=_note("the first update it covers"))
    last_step: int = field(metadata=_note("the last update it covers"))
    count: int = field(metadata=_note("the updates it covers"))
    epoch: int = field(metadata=_note("the last update's epoch"))
    examples: int = field(metadata=_note("examples trained on in them"))
    loss: float | None = field(metadata=_note("the last finite loss among them (null: none)"))
    position: int | None = field(default=None, metadata=_note("the last update's position"))
    dropped: int = field(default=0, metadata=_note("telemetry frames dropped so far"))
    step_time_ms: list[float] = field(
        metadata=_note("step time: [min, median, max, sum] ms over its steps"))
    input_wait_ms: list[float] | None = field(
        default=None, metadata=_note("input wait" + _SPREAD_NOTE))
    compute_ms: list[float] | None = field(
        default=None, metadata=_note("compute" + _SPREAD_NOTE))
    sync_ms: list[float] | None = field(
        default=None, metadata=_note("gradient all-reduce" + _SPREAD_NOTE))
    update_ms: list[float] | None = field(
        default=None, metadata=_note("optimizer update" + _SPREAD_NOTE))
    breakdown_ms: list[float] | None = field(default=None, metadata=_note(
        "[step, input, compute, sync, update] ms summed over its steps that have a "
        "breakdown (null: none has)"))

    def figure(self, name: str, part: str) -> float | None:
        """One of a spread field's [min, median, max, sum] (None: not measured, or a
        spread of the wrong shape)."""
        values = getattr(self, name)
        if values is None or len(values) != len(SPREAD):
            return None
        return float(values[SPREAD.index(part)])

    @property
    def examples_per_s(self) -> float | None:
        """Its examples over its steps' summed time."""
        step_sum = self.figure("step_time_ms", "sum")
        return per_second(self.examples, step_sum) if step_sum is not None else None

    @property
    def input_wait_pct(self) -> float | None:
        """Its steps' summed input wait over their summed time (None: not measured)."""
        step_sum, wait_sum = self.figure("step_time_ms", "sum"), self.figure("input_wait_ms", "sum")
        if step_sum is None or wait_sum is None:
            return None
        return input_wait_pct(wait_sum, step_sum)

    @property
    def breakdown(self) -> Breakdown | None:
        """Its steps' breakdowns added up (sum_breakdowns' of the same steps)."""
        parts = self.breakdown_ms
        if parts is None or len(parts) != 5:
            return None
        return breakdown(*parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint(Event):
    """A checkpoint was written."""

    TYPE: ClassVar[str] = "checkpoint"
    FROM: ClassVar[str] = "trainer"
    attempt: int = _attempt()
    step: int = field(metadata=_note("the optimizer step it holds"))
    micro_step: int = field(metadata=_note("the micro-step it holds"))
    path: str = field(metadata=_note("its path prefix"))
    seconds: float = field(metadata=_note("time the save took"))
    worker: int = field(default=0, metadata=_note("the worker that sent it (0 = chief)"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Resume(Event):
    """The attempt continues from a checkpoint."""

    TYPE: ClassVar[str] = "resume"
    FROM: ClassVar[str] = "trainer"
    attempt: int = _attempt()
    from_step: int = field(metadata=_note("the checkpoint's optimizer step"))
    from_micro_step: int = field(metadata=_note("its micro-step"))
    checkpoint: str | None = field(metadata=_note("its path"))
    position: int = field(default=0, metadata=_note("examples trained on before it"))
    data_order: str = field(
        default="continued", metadata=_note('"continued" or "restarted"')
    )
    data_note: str = field(default="", metadata=_note("why the data order restarted"))
    lost_steps: int | None = field(
        default=None, metadata=_note("added by the supervisor: steps since the checkpoint")
    )
    worker: int = field(default=0, metadata=_note("the worker that sent it (0 = chief)"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Reconfigured(Event):
    """The trainer applied (or refused) live settings in the same process."""

    TYPE: ClassVar[str] = "reconfigured"
    FROM: ClassVar[str] = "trainer"
    attempt: int = _attempt()
    id: int = field(metadata=_note("the reconfigure request's id"))
    ok: bool = field(metadata=_note("whether the new settings now apply"))
    step: int = field(
        metadata=_note("the last step under the old settings; the new apply from step + 1")
    )
    changed: list[str] = field(metadata=_note("the dotted keys that changed"))
    seconds: float = field(metadata=_note("time the switch took"))
    message: str = field(default="", metadata=_note("why not (ok false), or a note, one line"))
    worker: int = field(default=0, metadata=_note("the worker that sent it (0 = chief)"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Done(Event):
    """The trainer is ending after a checkpoint."""

    TYPE: ClassVar[str] = "done"
    FROM: ClassVar[str] = "trainer"
    attempt: int = _attempt()
    reason: str = field(metadata=_note('"max_steps", "epochs", "sigterm", "socket_lost", or a '
                                    'script\'s "exited"'))
    step: int = field(metadata=_note("the last optimizer step"))
    worker: int = field(default=0, metadata=_note("the worker that sent it (0 = chief)"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Error(Event):
    """The trainer cannot go on; the message is its root cause, one line."""

    TYPE: ClassVar[str] = "error"
    FROM: ClassVar[str] = "trainer"
    attempt: int = _attempt()
    kind: str = field(metadata=_note('"config", "factory" or "runtime"'))
    message: str = field(metadata=_note("one line"))
    worker: int = field(default=0, metadata=_note("the worker that sent it (0 = chief)"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Hook(Event):
    """What gpuwatch's hook in a person's own command (`gpuwatch run`) instruments, or why
    it could not: sent when it installs, and again when it learns more."""

    TYPE: ClassVar[str] = "hook"
    FROM: ClassVar[str] = "trainer"
    attempt: int = _attempt()
    installed: bool = field(metadata=_note("the hook runs in the command's Python"))
    message: str = field(default="", metadata=_note("why not, or what it watches: one line"))
    tensorflow: bool = field(default=False, metadata=_note("the command imported TensorFlow"))
    keras_version: str = field(default="", metadata=_note("Keras' version, once imported"))
    loop: str = field(
        default="",
        metadata=_note('"fit", "fit (callback)", "strategy.run (tf.function)", '
                       '"strategy.run (eager)"; "": no training loop seen yet'),
    )
    input_wait: str = field(
        default="", metadata=_note('"" measured, else why it is not measurable')
    )
    strategy: str = field(default="", metadata=_note("the strategy's class, once seen"))
    worker: int = field(default=0, metadata=_note("the worker that sent it (0 = chief)"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Run(Event):
    """The run: the first line of events.jsonl (attempt 0)."""

    TYPE: ClassVar[str] = "run"
    FROM: ClassVar[str] = "supervisor"
    run_id: str = field(metadata=_note("the run's id"))
    name: str = field(default="", metadata=_note("the config's name"))
    config_path: str = field(metadata=_note("the config as given"))
    supervisor_pid: int = field(metadata=_note("the supervisor's process id"))
    host: str = field(metadata=_note("where it runs"))
    settings: dict[str, Any] = field(metadata=_note("the validated config"))
    created: float | None = field(default=None, metadata=_note("when the run was made"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt(Event):
    """An attempt starts with these settings."""

    TYPE: ClassVar[str] = "attempt"
    FROM: ClassVar[str] = "supervisor"
    attempt: int = _attempt()
    settings: dict[str, Any] = field(metadata=_note("the full validated config"))
    fresh: bool = field(default=False, metadata=_note("whether it ignores checkpoints"))
    reason: str = field(
        default="start", metadata=_note('"start", "relaunch", "live", "resume" or "scale"')
    )
    config_path: str = field(default="", metadata=_note("attempt-N.yaml in the run directory"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Scale(Event):
    """The run is a scaling probe: a short fresh attempt at each device count, in order."""

    TYPE: ClassVar[str] = "scale"
    FROM: ClassVar[str] = "supervisor"
    counts: list[int] = field(metadata=_note("the device counts, in the order they run"))
    unit: str = field(
        default="replicas", metadata=_note('"replicas", or "workers" for a cluster')
    )
    mode: str = field(
        default="weak",
        metadata=_note('"weak" (the per-replica batch kept) or "strong" (the global batch kept)'),
    )
    steps: int = field(metadata=_note("optimizer steps of each attempt, warm-up included"))
    cores: int | None = field(
        default=None,
        metadata=_note("CPU cores the supervisor's host lets its trainers use (logical CPU "
                       "replicas beyond them share cores)"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusChange(Event):
    """The run's status changed (see STATUSES)."""

    TYPE: ClassVar[str] = "status"
    FROM: ClassVar[str] = "supervisor"
    attempt: int = _attempt()
    status: str = field(metadata=_note("one of STATUSES"))
    exit_code: int | None = field(default=None, metadata=_note("the trainer's, if it exited"))
    signal: str | None = field(default=None, metadata=_note("the signal that ended it"))
    message: str | None = field(default=None, metadata=_note("what happened, one line"))
    log_tail: list[str] = field(
        default_factory=list, metadata=_note("the trainer log's last lines, on a crash")
    )
    worker: int | None = field(
        default=None, metadata=_note("the worker whose exit set this status, in a cluster")
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample(Event):
    """One device sample of the host (1 Hz)."""

    TYPE: ClassVar[str] = "sample"
    FROM: ClassVar[str] = "supervisor"
    host: dict[str, Any] = field(metadata=_note("cpu_pct, mem_used_bytes, ..."))
    gpus: list[dict[str, Any]] = field(metadata=_note("one per GPU"))
    nvml: str | None = field(metadata=_note("null when NVML works, else why it does not"))
    worker: int = field(default=0, metadata=_note("the worker whose host it samples"))
    gpu_summary: dict[str, Any] | None = field(
        default=None,
        metadata=_note(f"past {SUMMARY_PAST_WORKERS} workers, a worker's (not the chief's) "
                       "GPUs summed, gpus then empty: count, lost, util_gpu_pct [min, mean, "
                       "max], mem_used_bytes, mem_total_bytes, pcie_bytes_per_s, "
                       "nvlink_bytes_per_s"),
    )


EVENTS: Mapping[str, type[Event]] = MappingProxyType(
    {
        cls.TYPE: cls
        for cls in (Hello, Step, Checkpoint, Resume, Reconfigured, Done, Error, Hook, Run,
                    Attempt, Scale, StatusChange, Sample, StepSummary)
    }
)
TRAINER_EVENTS = frozenset(name for name, cls in EVENTS.items() if cls.FROM == "trainer")
# What a remote agent relays: its trainer's events, and its own step summaries.
AGENT_EVENTS = TRAINER_EVENTS | {StepSummary.TYPE}
# Each event's field names, in order: event_frame runs for every event recorded, and
# dataclasses.fields() rebuilds its tuple on every call.
_FIELD_NAMES: Mapping[type[Event], tuple[str, ...]] = MappingProxyType(
    {cls: tuple(f.name for f in fields(cls)) for cls in EVENTS.values()}
)


def input_wait_pct(input_wait_ms: float, step_time_ms: float) -> float | None:
    """Input wait as a share of step time, in %: the one place this is computed. None
    without a step time, or for a share no float holds (1 ms of a 1e-310 ms step)."""
    if step_time_ms <= 0:
        return None
    pct = 100.0 * input_wait_ms / step_time_ms
    return pct if math.isfinite(pct) else None


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Where the time of one step (or of a sum of steps) went, in ms.

    The five parts sum to ``total_ms``: ``other_ms`` is the step time less the four
    measured parts (host work and dispatch between them), never below 0; a step whose
    parts overrun it by float rounding has total_ms = the parts' sum.
    """

    step_ms: float
    input_ms: float
    compute_ms: float
    sync_ms: float
    update_ms: float

    PARTS: ClassVar[tuple[str, ...]] = ("input", "compute", "sync", "update", "other")

    @property
    def other_ms(self) -> float:
        return max(0.0, self.step_ms - self.measured_ms)

    @property
    def measured_ms(self) -> float:
        return self.input_ms + self.compute_ms + self.sync_ms + self.update_ms

    @property
    def total_ms(self) -> float:
        return self.measured_ms + self.other_ms

    def ms(self, part: str) -> float:
        """One part's time: a name from PARTS."""
        return self.other_ms if part == "other" else float(getattr(self, f"{part}_ms"))

    def pct(self, part: str) -> float:
        """One part's share of the step, in %; the five sum to 100."""
        total = self.total_ms
        return 100.0 * self.ms(part) / total if total > 0 else 0.0

    def shares(self) -> dict[str, float]:
        """Every part's share, in %, in PARTS order."""
        return {part: self.pct(part) for part in self.PARTS}

    def __add__(self, other: Breakdown) -> Breakdown:
        """Two steps' (or sums') parts added: the breakdown of their sum."""
        return Breakdown(self.step_ms + other.step_ms, self.input_ms + other.input_ms,
                         self.compute_ms + other.compute_ms, self.sync_ms + other.sync_ms,
                         self.update_ms + other.update_ms)


def sum_breakdowns(parts: Iterable[Breakdown | None]) -> Breakdown | None:
    """The breakdown of several steps together (their sums' shares); steps without one are
    left out; None when none has one."""
    total: Breakdown | None = None
    for part in parts:
        if part is not None:
            total = part if total is None else total + part
    return total


def breakdown(step_time_ms: float, input_wait_ms: float, compute_ms: float | None,
              sync_ms: float | None, update_ms: float | None) -> Breakdown | None:
    """A step's breakdown, or None where a part was not measured (an older trainer, the
    optimizer's own all-reduce) or the step has no time: the one place it is made."""
    if compute_ms is None or sync_ms is None or update_ms is None or step_time_ms <= 0:
        return None
    parts = (step_time_ms, input_wait_ms, compute_ms, sync_ms, update_ms)
    if not all(math.isfinite(v) and v >= 0 for v in parts):
        return None
    return Breakdown(*parts)


def per_second(amount: float, ms: float) -> float | None:
    """`amount` in `ms` milliseconds as a rate per second: the one place a rate (examples/s,
    gradient-sync bytes/s) is computed. None without time, or for a rate no float holds
    (64 examples in a step of 1e-310 ms: finite figures, an infinite rate)."""
    if ms <= 0:
        return None
    rate = amount * 1000.0 / ms
    return rate if math.isfinite(rate) else None


@dataclass(frozen=True, slots=True)
class Envelope:
    """What every frame carries besides its event."""

    type: str
    seq: int | None = None
    t: float | None = None


def event_frame(event: Event, *, t: float | None = None, seq: int | None = None
                ) -> dict[str, Any]:
    """The frame dict of an event: envelope first, then its fields. The one place it is built."""
    frame: dict[str, Any] = {"v": PROTOCOL_VERSION, "type": event.TYPE}
    if seq is not None:
        frame["seq"] = seq
    if t is not None:
        frame["t"] = t
    names = _FIELD_NAMES.get(type(event))
    for name in names if names is not None else (f.name for f in fields(event)):
        frame[name] = getattr(event, name)
    return frame


def encode_event(event: Event, *, t: float | None = None, seq: int | None = None) -> bytes:
    """One event as bytes, newline included."""
    return encode_frame(event_frame(event, t=t, seq=seq))


def parse_event(frame: Mapping[str, Any]) -> tuple[Envelope, Event]:
    """The envelope and the typed event of a decoded frame; ProtocolError if it is not one.

    Every declared field is checked against its type (an int is never a bool; a
    float field takes an int); a missing field without a default, an unknown field
    or an unknown type is refused.
    """
    frame_type = frame.get("type")
    cls = EVENTS.get(frame_type) if isinstance(frame_type, str) else None
    if cls is None:
        raise ProtocolError(f"unknown event type {_show(frame_type)}")
    seq, t = frame.get("seq"), frame.get("t")
    if seq is not None and (type(seq) is not int or seq < 0):
        raise ProtocolError(f"{cls.TYPE}: seq must be an integer >= 0 (got {_show(seq)})")
    if t is not None and not _finite_number(t):
        raise ProtocolError(f"{cls.TYPE}: t must be a number (got {_show(t)})")
    checks = _EVENT_CHECKS[cls.TYPE]
    plain = _PLAIN_FIELDS[cls.TYPE].get
    nullable = _NULLABLE_FIELDS[cls.TYPE]
    isfinite = math.isfinite
    values: dict[str, Any] = dict(_EVENT_DEFAULTS[cls.TYPE])  # the frame's fields replace them
    for key, value in frame.items():
        # The common cases first (the dashboard reads 100 steps a second): a value already
        # of its field's exact type (a finite float for a float), or None where the field
        # takes None, kept as it is; anything else takes the full check below.
        got = type(value)
        if got is plain(key) and (got is not float or isfinite(value)):
            values[key] = value
            continue
        if value is None and key in nullable:
            values[key] = None
            continue
        if key in _ENVELOPE_KEYS:
            continue
        check = checks.get(key)
        if check is None:
            raise ProtocolError(f"{cls.TYPE}: unknown field {_show(key)}")
        ok, kept = check(value)
        if not ok:
            raise ProtocolError(f"{cls.TYPE}: {key} must be {kept} (got {_show(value)})")
        values[key] = kept
    try:
        event = _EVENT_MAKERS[cls](values)
    except TypeError as exc:
        raise ProtocolError(f"{cls.TYPE}: {_one_line(exc)}") from None
    return Envelope(cls.TYPE, seq, float(t) if t is not None else None), event


def _finite_number(value: Any) -> bool:
    """An int or float a float can hold (10**400 is neither: OverflowError, so False)."""
    if type(value) not in (int, float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _type_check(annotation: Any) -> Callable[[Any], tuple[bool, Any]]:
    """A check for one declared field type: (True, value kept) or (False, words)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    optional = text.endswith(" | None")
    base = text.removesuffix(" | None")
    simple: dict[str, tuple[Callable[[Any], bool], Callable[[Any], Any], str]] = {
        "int": (lambda v: type(v) is int, int, "an integer"),
        "float": (
            _finite_number,
            float,
            "a finite number",
        ),
        "str": (lambda v: isinstance(v, str), str, "a string"),
        "bool": (lambda v: v is True or v is False, bool, "true or false"),
        "list[str]": (
            lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v),
            list,
            "a list of strings",
        ),
        "list[int]": (
            lambda v: isinstance(v, list) and all(type(i) is int for i in v),
            list,
            "a list of integers",
        ),
        "list[float]": (
            lambda v: isinstance(v, list) and len(v) <= 16 and all(map(_finite_number, v)),
            lambda v: [float(i) for i in v],
            "a list of at most 16 finite numbers",
        ),
        "dict[str, Any]": (lambda v: isinstance(v, dict), dict, "an object"),
        "list[dict[str, Any]]": (
            lambda v: isinstance(v, list) and all(isinstance(i, dict) for i in v),
            list,
            "a list of objects",
        ),
    }
    if base not in simple:
        raise TypeError(f"event field type {text!r} has no wire check")
    accepts, convert, words = simple[base]
    words = f"{words} or null" if optional else words

    def check(value: Any) -> tuple[bool, Any]:
        if value is None and optional:
            return True, None
        if accepts(value):
            return True, convert(value)
        return False, words

    return check


_EVENT_CHECKS: Mapping[str, Mapping[str, Callable[[Any], tuple[bool, Any]]]] = MappingProxyType(
    {
        name: MappingProxyType({f.name: _type_check(f.type) for f in fields(cls)})
        for name, cls in EVENTS.items()
    }
)


def _plain_type(annotation: Any) -> type | None:
    """The type a field's value has when it needs no conversion (int, float, str, bool)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return {"int": int, "float": float, "str": str, "bool": bool}.get(
        text.removesuffix(" | None")
    )


# parse_event's fast path, per event type: each field's plain type, and the fields that
# take None. Plain dicts: a MappingProxyType's get costs a call more per field.
_PLAIN_FIELDS: Mapping[str, dict[str, type]] = MappingProxyType(
    {
        name: {f.name: plain for f in fields(cls) if (plain := _plain_type(f.type)) is not None}
        for name, cls in EVENTS.items()
    }
)
_NULLABLE_FIELDS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        name: frozenset(key for key, check in checks.items() if check(None) == (True, None))
        for name, checks in _EVENT_CHECKS.items()
    }
)
_ENVELOPE_KEYS = frozenset(ENVELOPE)
assert not any(f.name in _ENVELOPE_KEYS for cls in EVENTS.values() for f in fields(cls))


def _event_maker(cls: type[Event]) -> Callable[[Mapping[str, Any]], Event]:
    """``cls(**values)`` for values parse_event has checked, each slot set directly.

    A frozen dataclass's __init__ sets every field through object.__setattr__: for a
    step that cost more than all of parse_event's checks. When values holds every field
    (parse_event starts from the defaults: _EVENT_DEFAULTS) this sets the same slots to
    the same values; else it is ``cls(**values)`` itself (a default factory to call, or
    a field missing: the dataclass's own TypeError).
    """
    assert not hasattr(cls, "__post_init__"), cls  # that would have to run here too
    new = object.__new__
    slots = tuple((f.name, getattr(cls, f.name).__set__) for f in fields(cls))

    def make(values: Mapping[str, Any]) -> Event:
        event = new(cls)
        try:
            for name, set_slot in slots:
                set_slot(event, values[name])
        except KeyError:
            return cls(**values)
        return event

    return make


# Each event's plain defaults (not its default factories: a new list each time).
_EVENT_DEFAULTS: Mapping[str, dict[str, Any]] = MappingProxyType(
    {
        name: {f.name: f.default for f in fields(cls) if f.default is not MISSING}
        for name, cls in EVENTS.items()
    }
)
_EVENT_MAKERS: Mapping[type[Event], Callable[[Mapping[str, Any]], Event]] = MappingProxyType(
    {cls: _event_maker(cls) for cls in EVENTS.values()}
)


def event_reference(width: int = 86) -> str:
    """The events and their fields as text, generated from the declarations."""
    lines: list[str] = []
    for source, title in (("trainer", "trainer -> supervisor (the trainer's telemetry socket)"),
                          ("agent", f"agent -> supervisor (past {SUMMARY_PAST_WORKERS} workers, "
                                    "instead of a worker's steps but the chief's)"),
                          ("supervisor", "supervisor -> dashboard, besides every trainer "
                                         "and agent event relayed")):
        lines.append(f"{title}:")
        for cls in EVENTS.values():
            if source != cls.FROM:
                continue
            summary = (cls.__doc__ or "").strip().splitlines()[0]
            lines.extend(textwrap.wrap(f"{cls.TYPE:<11} {summary}", width,
                                       initial_indent="  ", subsequent_indent=" " * 14))
            for f in fields(cls):
                text = f"{f.name} ({f.type}): {f.metadata['note']}"
                lines.extend(textwrap.wrap(text, width, initial_indent=" " * 14,
                                           subsequent_indent=" " * 16))
    return "\n".join(lines)


# -- supervisor -> dashboard: a snapshot of the run's state ---------------------------
#
# What a dashboard would have folded from events 0..seq, sent in parts of at most
# SNAPSHOT_PART_CHARS characters so that no frame comes near MAX_FRAME_BYTES (a part's
# text, JSON-escaped, grows at most 12x for characters outside ASCII).

SNAPSHOT = "snapshot"
SNAPSHOT_PART_CHARS = 1 << 16
# The most a client joins (a longer one is a bad frame: the connection is closed).
MAX_SNAPSHOT_CHARS = 64 << 20
_SNAPSHOT_FIELDS = frozenset({"v", "type", "seq", "schema", "part", "parts", "data"})


def snapshot_frames(seq: int, schema: str, text: str) -> list[bytes]:
    """The frames of one snapshot text (the state after event seq), in order."""
    pieces = [text[i:i + SNAPSHOT_PART_CHARS]
              for i in range(0, len(text), SNAPSHOT_PART_CHARS)] or [""]
    return [
        encode_frame({"v": PROTOCOL_VERSION, "type": SNAPSHOT, "seq": seq, "schema": schema,
                      "part": index, "parts": len(pieces), "data": piece})
        for index, piece in enumerate(pieces)
    ]


class SnapshotParts:
    """Joins snapshot frames into one ``{"type": "snapshot", seq, schema, data}`` frame.

    ``feed`` returns None until the last part, then the joined frame. A part out of
    order, of another snapshot, or over MAX_SNAPSHOT_CHARS in all is a ProtocolError.
    """

    def __init__(self) -> None:
        self._head: tuple[int, str, int] | None = None
        self._pieces: list[str] = []
        self._chars = 0

    def feed(self, frame: Mapping[str, Any]) -> dict[str, Any] | None:
        seq, schema, part, parts, data = (frame.get(k) for k in
                                          ("seq", "schema", "part", "parts", "data"))
        unknown = set(frame) - _SNAPSHOT_FIELDS
        if (unknown or type(seq) is not int or seq < 0 or not isinstance(schema, str)
                or type(part) is not int or type(parts) is not int or not 0 <= part < parts
                or not isinstance(data, str)):
            raise ProtocolError("snapshot: a part must carry seq, schema, part < parts and "
                                "data, and nothing else")
        if part == 0:
            self._head, self._pieces, self._chars = (seq, schema, parts), [], 0
        elif self._head != (seq, schema, parts) or part != len(self._pieces):
            raise ProtocolError(f"snapshot: part {part} of {parts} came out of order")
        self._chars += len(data)
        if self._chars > MAX_SNAPSHOT_CHARS:
            raise ProtocolError(f"snapshot: over {MAX_SNAPSHOT_CHARS} characters")
        self._pieces.append(data)
        if part < parts - 1:
            return None
        text, self._head, self._pieces, self._chars = "".join(self._pieces), None, [], 0
        return {"v": PROTOCOL_VERSION, "type": SNAPSHOT, "seq": seq, "schema": schema,
                "data": text}


# -- supervisor -> trainer: live settings ----------------------------------------------
#
# The one frame the supervisor sends down a trainer's telemetry socket. The trainer
# answers with a ``reconfigured`` event.

RECONFIGURE = "reconfigure"
_RECONFIGURE_FIELDS = ("v", "type", "id", "settings", "at_step", "deadline_s")
# How long after a live change reaches the trainer it may still begin to apply it; past
# that it refuses it (so a late "applied" can never follow the supervisor giving up).
LIVE_DEADLINE_S = 10.0
MAX_LIVE_DEADLINE_S = 3600.0


def reconfigure_frame(
    request_id: int, settings: dict[str, Any], at_step: int,
    deadline_s: float = LIVE_DEADLINE_S,
) -> bytes:
    """The supervisor's request to apply `settings` (the full config) from step at_step + 1.

    The trainer applies it at the first execution boundary where its step >= at_step,
    if that comes within deadline_s of the request's arrival; else it refuses it.
    """
    return encode_frame({"v": PROTOCOL_VERSION, "type": RECONFIGURE, "id": request_id,
                         "settings": settings, "at_step": at_step, "deadline_s": deadline_s})


def parse_reconfigure(frame: Mapping[str, Any]) -> tuple[int, dict[str, Any], int, float]:
    """(id, settings, at_step, deadline_s) of a decoded reconfigure frame; ProtocolError else.

    deadline_s may be left out (LIVE_DEADLINE_S).
    """
    if not isinstance(frame, Mapping):
        raise ProtocolError(f"reconfigure: a frame must be a JSON object (got {_show(frame)})")
    version = frame.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError(f"reconfigure: v must be {PROTOCOL_VERSION} (got {_show(version)})")
    if frame.get("type") != RECONFIGURE:
        raise ProtocolError(f"reconfigure: type must be \"reconfigure\" "
                            f"(got {_show(frame.get('type'))})")
    for key in frame:
        if key not in _RECONFIGURE_FIELDS:
            raise ProtocolError(f"reconfigure: unknown field {_show(key)}")
    values: list[Any] = []
    for key in ("id", "settings", "at_step"):
        if key not in frame:
            raise ProtocolError(f"reconfigure: missing field {key!r}")
        value = frame[key]
        if key == "settings":
            if not isinstance(value, dict):
                raise ProtocolError(f"reconfigure: settings must be an object (got {_show(value)})")
        elif type(value) is not int or not 0 <= value <= MAX_WIRE_INT:
            raise ProtocolError(f"reconfigure: {key} must be an integer from 0 to "
                                f"{MAX_WIRE_INT} (got {_show(value)})")
        values.append(value)
    deadline = frame.get("deadline_s", LIVE_DEADLINE_S)
    if (type(deadline) not in (int, float) or not math.isfinite(deadline)
            or not 0 < deadline <= MAX_LIVE_DEADLINE_S):
        raise ProtocolError(f"reconfigure: deadline_s must be a number of seconds above 0 and "
                            f"at most {MAX_LIVE_DEADLINE_S:.0f} (got {_show(deadline)})")
    return values[0], dict(values[1]), values[2], float(deadline)
