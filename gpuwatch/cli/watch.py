"""The commands on a run that may be live: attach (its dashboard) and stop."""

from __future__ import annotations

import argparse
import contextlib
import time
from typing import TYPE_CHECKING

from gpuwatch.cli.common import EXIT_FAILED, EXIT_OK, err

if TYPE_CHECKING:
    from gpuwatch.runs.folders import RunInfo


def _dashboard(info: RunInfo) -> int:
    """The dashboard of a run: following its supervisor, or, once the run has ended and its
    supervisor is gone (an ended run attached to, or one that ended as it started), from
    its record, where `r` resumes it."""
    from gpuwatch.app import run_dashboard
    from gpuwatch.runs.folders import gpuwatch_home, read_run_info

    home = gpuwatch_home()
    if _supervisor_up(info):
        result = run_dashboard(home, info.run_id, info.socket_path)
    else:
        info = read_run_info(info.run_dir)
        if _supervisor_up(info):  # started again meanwhile (a resume elsewhere)
            result = run_dashboard(home, info.run_id, info.socket_path)
        else:
            result = run_dashboard(home, info.run_id, record=info)
    if result == "stop":  # asked for, not yet acknowledged by the supervisor
        return _stop(read_run_info(info.run_dir))
    if result == "stopped":
        print(f"gpuwatch: run {info.run_id} stopped.")
        return EXIT_OK
    if result == "ended":
        status = read_run_info(info.run_dir).status
        print(
            f"gpuwatch: run {info.run_id} has ended ({status}); "
            f"gpuwatch resume {info.run_id} continues it"
        )
        return EXIT_OK
    print(
        f"gpuwatch: detached from run {info.run_id}; training goes on. "
        f"Come back with: gpuwatch attach {info.run_id}"
    )
    return EXIT_OK


def _supervisor_up(info: RunInfo) -> bool:
    return (
        info.supervisor_pid is not None
        and info.socket_path is not None
        and info.socket_path.exists()
    )


def cmd_attach(args: argparse.Namespace) -> int:
    from gpuwatch.runs.folders import resolve_run

    info = resolve_run(args.run)  # RunError: main() prints it, exit 2
    # A run that has ended is shown from its record (no supervisor): `r` there resumes it.
    return _dashboard(info)


def cmd_stop(args: argparse.Namespace) -> int:
    from gpuwatch.runs.folders import resolve_run

    info = resolve_run(args.run)  # RunError: main() prints it, exit 2
    return _stop(info)


def _stop(info: RunInfo) -> int:
    import asyncio

    from gpuwatch.follow.client import ClientError, RunClient

    if not info.live:
        return _release(info)
    if info.socket_path is None:
        print(f"gpuwatch: run {info.run_id} is already {info.status}")
        return EXIT_OK

    async def stop() -> str:
        assert info.socket_path is not None
        async with RunClient(info.socket_path) as client:
            reply = await client.command("stop", timeout_s=120.0)
            return str(reply.get("status"))

    try:
        status = asyncio.run(stop())
    except ClientError as exc:
        err(f"could not stop run {info.run_id}: {exc}")
        return EXIT_FAILED
    print(f"gpuwatch: run {info.run_id} {status}")
    return EXIT_OK


def _release(info: RunInfo) -> int:
    """An ended run whose supervisor lingers (for a relaunch): tell it to exit now."""
    import asyncio

    from gpuwatch.follow.client import ClientError, RunClient
    from gpuwatch.runs.folders import pid_alive

    pid = info.supervisor_pid
    if pid is None or info.socket_path is None or not info.socket_path.exists():
        print(f"gpuwatch: run {info.run_id} is already {info.status}")
        return EXIT_OK

    async def release() -> None:
        assert info.socket_path is not None
        async with RunClient(info.socket_path) as client:
            await client.command("stop", timeout_s=30.0)

    with contextlib.suppress(ClientError, TimeoutError, OSError):
        asyncio.run(release())  # it may hang up before the ack: its exit is what counts
    deadline = time.monotonic() + 15.0
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        err(f"run {info.run_id} is already {info.status}, but its supervisor (pid {pid}) "
             "did not exit")
        return EXIT_FAILED
    print(f"gpuwatch: run {info.run_id} was already {info.status}; its supervisor "
          f"(pid {pid}) has exited")
    return EXIT_OK
