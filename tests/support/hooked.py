"""Run a real script under gpuwatch's hook as the supervisor starts it (HOOK_DIR first on
PYTHONPATH, the settings and a socketpair's fd in the environment), and read back every
frame it sent: what the hook's own tests check against the script's own figures."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
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


def run_hooked(argv: list[str], *, cwd: Path | None = None, prefetch: Any = False,
               max_steps: int | None = None, hooked: bool = True,
               env: dict[str, str] | None = None, timeout_s: float = 240) -> Hooked:
    """argv under the hook (hooked=False: the same command without it)."""
    parent, child = socket.socketpair()
    full_env = dict(os.environ if env is None else env)
    full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    pass_fds: tuple[int, ...] = ()
    if hooked:
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(HOOK_DIR), *filter(None, [full_env.get("PYTHONPATH")])])
        full_env[ENV_FD] = str(child.fileno())
        full_env[ENV_SETTINGS] = hook_settings(attempt=1, prefetch=prefetch,
                                               max_steps=max_steps)
        pass_fds = (child.fileno(),)
    proc = subprocess.Popen(argv, env=full_env, pass_fds=pass_fds, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    child.close()
    parent.settimeout(timeout_s)
    data = b""
    try:
        while hooked:
            chunk = parent.recv(65536)
            if not chunk:
                break
            data += chunk
        output, _ = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        parent.close()
    events = [protocol.parse_event(protocol.decode(line))[1]
              for line in data.splitlines() if line.strip()]
    return Hooked(proc.returncode, output.decode(errors="replace"), events)


def script(name: str, *args: str) -> list[str]:
    return [sys.executable, str(SCRIPTS / name), *args]


def printed_losses(output: str) -> list[float]:
    """The losses the custom-loop script printed itself ("step N loss X")."""
    return [float(line.split()[3]) for line in output.splitlines()
            if line.startswith("step ") and " loss " in line]
