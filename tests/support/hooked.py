"""Run a real script under gpuwatch's hook as the supervisor starts it (HOOK_DIR first on
PYTHONPATH, the settings and a socketpair's fd in the environment), and read back every
frame it sent: what the hook's own tests check against the script's own figures."""

from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer_runtime import protocol
from trainer_runtime.hook import ENV_FD, ENV_SETTINGS, HOOK_DIR, hook_settings

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "scripts"


@dataclass
class Hooked:
    returncode: int
    output: str
    events: list[protocol.Event] = field(default_factory=list)

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    @property
    def steps(self) -> list[protocol.Step]:
        return self.of(protocol.Step)

    @property
    def hook(self) -> protocol.Hook:
        return self.of(protocol.Hook)[-1]


# A preloaded run's Python, before the script: what a start-up spends seconds on (the
# imports, as gpuwatch's spare trainer does ahead of a relaunch, trainer_runtime/spare.py),
# then a line on stdin, then the script itself, unchanged, as `python SCRIPT ARGS` runs it.
PRELOAD = ("import runpy, sys, tensorflow, keras; print({ready!r}, flush=True); "
           "sys.stdin.readline(); sys.argv = sys.argv[1:]; "
           "runpy.run_path(sys.argv[0], run_name='__main__')")
READY = "gpuwatch-test: preloaded, waiting for go"


class Started:
    """A process under the hook, started; finish() collects it (a preloaded one is told to
    go on first)."""

    def __init__(self, argv: list[str], *, cwd: Path | None, prefetch: Any,
                 max_steps: int | None, hooked: bool, env: dict[str, str] | None,
                 timeout_s: float, preload: bool, wait: bool = True) -> None:
        self.hooked, self.timeout_s, self.preload = hooked, timeout_s, preload
        if preload:
            argv = [argv[0], "-c", PRELOAD.format(ready=READY), *argv[1:]]
        self.parent, child = socket.socketpair()
        full_env = dict(os.environ if env is None else env)
        full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        # A temporary directory of its own, gone with it (kill()), unless the test names
        # one: TensorFlow leaves the bytecode of autograph's modules there (an unhooked
        # script's too), and a SIGKILLed script the modules themselves.
        self.scratch: str | None = None
        if env is None or "TMPDIR" not in env:
            self.scratch = full_env["TMPDIR"] = tempfile.mkdtemp(prefix="gpuwatch-script-")
        pass_fds: tuple[int, ...] = ()
        if hooked:
            full_env["PYTHONPATH"] = os.pathsep.join(
                [str(HOOK_DIR), *filter(None, [full_env.get("PYTHONPATH")])])
            full_env[ENV_FD] = str(child.fileno())
            full_env[ENV_SETTINGS] = hook_settings(attempt=1, prefetch=prefetch,
                                                   max_steps=max_steps)
            pass_fds = (child.fileno(),)
        self.proc = subprocess.Popen(argv, env=full_env, pass_fds=pass_fds, cwd=cwd,
                                     stdin=subprocess.PIPE if preload else None,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        child.close()
        self.early = b""  # what it printed before finish()
        if preload and wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Until the preloaded process has imported TensorFlow and waits for its go."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + self.timeout_s
        fd = self.proc.stdout.fileno()
        while READY.encode() not in self.early:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.kill()
                raise TimeoutError(f"not preloaded in {self.timeout_s:.0f} s: {self.early!r}")
            chunk = os.read(fd, 65536)
            if not chunk:
                self.kill()
                raise RuntimeError(f"exited while preloading: {self.early!r}")
            self.early += chunk
        self.early = self.early.replace(READY.encode() + b"\n", b"", 1)

    def finish(self) -> Hooked:
        """Let it go on (if preloaded), read every frame it sends until it exits."""
        if self.preload:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.flush()
        self.parent.settimeout(self.timeout_s)
        data = b""
        try:
            while self.hooked:
                chunk = self.parent.recv(65536)
                if not chunk:
                    break
                data += chunk
            output, _ = self.proc.communicate(timeout=self.timeout_s)
        finally:
            self.kill()
        events = [protocol.parse_event(protocol.decode(line))[1]
                  for line in data.splitlines() if line.strip()]
        return Hooked(self.proc.returncode, (self.early + output).decode(errors="replace"),
                      events)

    def kill(self) -> None:
        """End it if it still runs (a test that failed before finish())."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        self.parent.close()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


def start_hooked(argv: list[str], *, cwd: Path | None = None, prefetch: Any = False,
                 max_steps: int | None = None, hooked: bool = True,
                 env: dict[str, str] | None = None, timeout_s: float = 240,
                 preload: bool = False, wait: bool = True) -> Started:
    """argv under the hook (hooked=False: the same command without it), started.
    preload=True: returns once it has imported TensorFlow and Keras (wait=False: at once;
    wait_ready() waits for that); the script itself runs only at finish()."""
    return Started(argv, cwd=cwd, prefetch=prefetch, max_steps=max_steps, hooked=hooked,
                   env=env, timeout_s=timeout_s, preload=preload, wait=wait)


def run_hooked(argv: list[str], **options: Any) -> Hooked:
    """argv under the hook, run to its end (the options of start_hooked)."""
    return start_hooked(argv, **options).finish()


def script(name: str, *args: str) -> list[str]:
    return [sys.executable, str(SCRIPTS / name), *args]


def printed_losses(output: str) -> list[float]:
    """The losses the custom-loop script printed itself ("step N loss X")."""
    return [float(line.split()[3]) for line in output.splitlines()
            if line.startswith("step ") and " loss " in line]
