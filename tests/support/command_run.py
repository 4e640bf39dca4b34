"""A person's own command's run (gpuwatch run) as recorded events, for tests of what the
screen and headless make of it: the run and attempt events with a command in their
settings, its hook's event, a TensorFlow script's hello and steps (input wait measured,
or null where its loop does not let it be)."""

from __future__ import annotations

from typing import Any

from trainer_runtime.schema import CommandConfig, RunConfig

T0 = 1_750_000_000.0
ARGV = ["python", "train.py", "--epochs", "3"]


def command_settings(argv: list[str] | None = None, **data: Any) -> dict[str, Any]:
    """A command run's settings as its config records them (every key, defaults too)."""
    command = CommandConfig(argv=argv or ARGV, cwd="/home/ana/work")
    config = RunConfig(name="train.py", command=command, **data)
    return config.model_dump(mode="json")


class CommandEvents:
    """Events of one command run, numbered and timed as events.jsonl holds them."""

    def __init__(self, settings: dict[str, Any] | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.t = T0
        self.settings = settings or command_settings()
        self.attempt = 0

    def emit(self, frame_type: str, **fields: Any) -> CommandEvents:
        head = {"v": 1, "type": frame_type, "seq": len(self.events), "t": round(self.t, 3)}
        self.events.append({**head, **fields})
        return self

    def start(self, reason: str = "start") -> CommandEvents:
        """The run (first time), the attempt, and running at once (its process started)."""
        if not self.events:
            self.emit("run", run_id="1124-cmdr", config_path="/r/config.yaml", created=T0,
                      supervisor_pid=4200, host="box", settings=self.settings)
        self.attempt += 1
        self.emit("attempt", attempt=self.attempt, settings=self.settings, fresh=False,
                  reason=reason)
        self.emit("status", status="starting", attempt=self.attempt)
        return self.emit("status", status="running", attempt=self.attempt)

    def hook(self, **fields: Any) -> CommandEvents:
        values = {"installed": True, "message": "", "tensorflow": True,
                  "keras_version": "3.15.1", "loop": "fit", "input_wait": "",
                  "strategy": "MirroredStrategy", **fields}
        return self.emit("hook", attempt=self.attempt, **values)

    def hello(self, replicas: int = 2, batch: int = 64) -> CommandEvents:
        devices = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(replicas)]
        return self.emit("hello", attempt=self.attempt, pid=4300 + self.attempt,
                         tf_version="2.21.0", replicas=replicas, device_kind="cpu",
                         devices=devices, param_count=1000, param_bytes=4000,
                         global_batch_size=batch, accumulation_steps=1,
                         per_replica_batch=batch // replicas, start_step=0,
                         start_micro_step=0)

    def steps(self, count: int, *, step_ms: float = 20.0, wait_ms: float | None = None,
              first: int = 1, batch: int = 64) -> CommandEvents:
        for index in range(count):
            self.t += step_ms / 1000.0
            number = first + index
            self.emit("step", attempt=self.attempt, step=number, micro_step=number, epoch=0,
                      loss=0.5, lr=None, examples=batch, step_time_ms=step_ms,
                      input_wait_ms=wait_ms, grad_sync_bytes=0.0, dropped=0)
        return self

    def end(self, status: str, **fields: Any) -> CommandEvents:
        self.t += 1.0
        return self.emit("status", status=status, attempt=self.attempt, **fields)
