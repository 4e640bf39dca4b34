"""Remote agents: the agent process over plain pipes, RemoteAgent over a real ssh, and a link
that talks garbage. No TensorFlow: the agent runs the stand-in trainer (tests/data/fake_trainer.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.supervisor.agent import AgentStartError
from gpuwatch.supervisor.agent_process import LOG_BYTES_PER_S, _AgentProcess
from gpuwatch.supervisor.cluster import srun_prefix, ssh_prefix
from gpuwatch.supervisor.exits import TrainerExit, exit_status
from gpuwatch.supervisor.link import frames_of
from gpuwatch.supervisor.ports import ephemeral_range
from gpuwatch.supervisor.remote_agent import RemoteAgent
from gpuwatch.supervisor.worker_role import WorkerLaunch
from tests.support.ports import can_bind
from tests.support.run_record import alive
from tests.support.sshd import SshServer, sshd  # noqa: F401 - the fixture
from trainer_runtime.protocol import Event as ProtocolEvent
from trainer_runtime.protocol import FrameBuffer, HostSample, ProtocolError, encode

ROOT = Path(__file__).resolve().parents[2]
FAKE = "tests.data.fake_trainer"
CONFIG_TEXT = "name: remote-test\n"


async def until(predicate: Callable[[], Any], what: str, timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.02)


def agent_env(mode: str) -> dict[str, str]:
    return {
        "PYTHONPATH": str(ROOT),
        "GPUWATCH_TRAINER_MODULE": FAKE,
        "GPUWATCH_FAKE_TRAINER": mode,
        "GPUWATCH_SAMPLE_INTERVAL_S": "0.2",
        "GPUWATCH_USER_CWD": str(ROOT),
    }


# -- launchers ------------------------------------------------------------------------


def test_ssh_prefix_puts_options_before_the_destination() -> None:
    assert ssh_prefix("node-b", ["-F", "cfg", "-o", "ProxyJump=gw"]) == (
        "ssh", "-T", "-F", "cfg", "-o", "ProxyJump=gw", "-o", "BatchMode=yes", "--", "node-b"
    )
    with pytest.raises(ValueError):
        ssh_prefix("-oProxyCommand=evil")
    with pytest.raises(ValueError):
        ssh_prefix("")


def test_srun_prefix_names_one_node_of_the_allocation_by_its_place() -> None:
    argv = srun_prefix(2)
    assert argv[0] == "srun" and "--relative=2" in argv
    assert {"--nodes=1", "--ntasks=1", "--kill-on-bad-exit=1"} <= set(argv)


def test_the_remote_command_is_one_quoted_string_for_ssh_and_plain_argv_for_srun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUWATCH_TRAINER_MODULE", raising=False)
    def agent(prefix: list[str]) -> RemoteAgent:
        return RemoteAgent(
            2, tmp_path / "my run", argv_prefix=prefix, python="/opt/py env/bin/python",
            on_frame=lambda *a: None, on_exit=lambda *a: None, on_sample=lambda *a: None,
            remote_env={"A": "x y"},
        )

    over_ssh = agent(list(ssh_prefix("node-b"))).command()
    assert over_ssh[:-1] == list(ssh_prefix("node-b"))
    assert over_ssh[-1] == (
        "env 'A=x y' '/opt/py env/bin/python' -m gpuwatch.supervisor.remote "
        "--run-id 'my run' --index 2"
    )  # the worker's directory is found there, under that account's own gpuwatch home
    over_srun = agent(list(srun_prefix(2))).command()
    assert over_srun[len(srun_prefix(2)):][:3] == ["env", "A=x y", "/opt/py env/bin/python"]
    assert agent(list(ssh_prefix("node-b"))).host == "node-b"
    # The one seam for a stand-in trainer (GPUWATCH_TRAINER_MODULE) goes there too.
    monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
    assert agent(list(ssh_prefix("node-b"))).command()[-1].startswith(
        "env 'A=x y' GPUWATCH_TRAINER_MODULE=tests.data.fake_trainer '/opt/py env/bin/python'")


def test_a_lost_link_reads_as_a_crash_with_the_links_words() -> None:
    status, fields = exit_status(
        TrainerExit(1, link_lost="agent link to node-b lost: ssh exited 255: Broken pipe"),
        relaunching=False, stop_requested=False,
    )
    assert status == "crashed"
    assert fields["message"] == "agent link to node-b lost: ssh exited 255: Broken pipe"
    assert fields["exit_code"] is None


def test_frames_before_a_bad_line_of_a_chunk_are_all_taken() -> None:
    frames = FrameBuffer()
    taken: list[str] = []
    chunk = encode("ready", port=1) + encode("log", lines=[]) + b"junk\n" + encode("exit")
    with pytest.raises(ProtocolError, match="not JSON"):
        for frame in frames_of(frames, chunk):
            taken.append(frame["type"])
    assert taken == ["ready", "log"]
    assert [f["type"] for f in frames_of(FrameBuffer(), encode("a") + b'{"v":1,')] == ["a"]


# -- the agent process over plain pipes -----------------------------------------------


class Link:
    """The supervisor's end of an agent process's stdio, frames in and out."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.frames: list[dict[str, Any]] = []
        self._buffer = FrameBuffer()

    def send(self, frame_type: str, **fields: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(encode(frame_type, **fields))

    async def next(self, frame_type: str, timeout_s: float = 20.0) -> dict[str, Any]:
        """The first frame of this type not yet taken (others are kept in self.frames)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for i, frame in enumerate(self.frames):
                if frame["type"] == frame_type:
                    return self.frames.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no {frame_type!r} frame within {timeout_s:.0f} s: {self.frames}")
            assert self.proc.stdout is not None
            try:
                chunk = await asyncio.wait_for(self.proc.stdout.read(1 << 16), left)
            except TimeoutError:
                continue
            if not chunk:
                pytest.fail(f"the agent ended before a {frame_type!r} frame: {self.frames}")
            self.frames += self._buffer.feed(chunk)

    async def rest(self) -> list[dict[str, Any]]:
        """Every frame until the agent closes stdout."""
        assert self.proc.stdout is not None
        data = await asyncio.wait_for(self.proc.stdout.read(), 30)
        self.frames += self._buffer.feed(data)
        frames, self.frames = self.frames, []
        return frames


@pytest.fixture
async def link(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    procs: list[asyncio.subprocess.Process] = []

    async def open_link(mode: str, index: int = 1) -> Link:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpuwatch.supervisor.remote", "--run-dir",
            str(tmp_path / "remote"), "--index", str(index),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={**os.environ, **agent_env(mode)},
        )
        procs.append(proc)
        return Link(proc)

    yield open_link
    for proc in procs:
        if proc.returncode is None:
            # As a lost link does: stdin closes, the agent stops its trainer and exits.
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def test_agent_prepares_starts_and_relays_a_finished_trainer(
    link: Callable[..., Any], tmp_path: Path
) -> None:
    agent: Link = await link("finish", index=1)
    agent.send("prepare")
    ready = await agent.next("ready")
    assert isinstance(ready["host"], str) and ready["host"]
    assert 0 < ready["port"] < 65536 and ready["pid"] == agent.proc.pid
    # The port is one no connection is given (gpuwatch/supervisor/ports.py), held until the start.
    first, last = ephemeral_range()
    assert not first <= ready["port"] <= last
    assert not can_bind(ready["port"]), "the agent holds its port until the start frame"
    launch = {"index": 1, "workers": 2, "env": {"TF_CONFIG": "{}"}}
    agent.send("start", attempt=3, config_text=CONFIG_TEXT, fresh=True, launch=launch)
    started = await agent.next("started")
    assert can_bind(ready["port"]), "let go for the trainer to bind"
    assert started["attempt"] == 3 and isinstance(started["pid"], int)
    events = [(await agent.next("event"))["frame"] for _ in range(3)]
    assert [(e["type"], e["attempt"], e["worker"]) for e in events] == [
        ("hello", 3, 1), ("step", 3, 1), ("done", 3, 1)
    ]
    ended = await agent.next("exit")
    assert ended["returncode"] == 0 and ended["done_reason"] == "max_steps"
    assert (tmp_path / "remote" / "attempt-3.yaml").read_text() == CONFIG_TEXT
    # Every line of the trainer's log went up before its exit, the header included.
    lines = [line for frame in agent.frames if frame["type"] == "log" for line in frame["lines"]]
    assert any(line.startswith("=== gpuwatch: attempt 3 starting") for line in lines)
    assert "fake trainer: attempt 3, finish, fresh=True" in lines
    sample = await agent.next("sample")
    assert "host" in sample["fields"] and "gpus" in sample["fields"]
    assert agent.proc.stdin is not None
    agent.proc.stdin.close()
    assert await asyncio.wait_for(agent.proc.wait(), 20) == 0


async def test_agent_reports_a_crash_with_its_cause(link: Callable[..., Any]) -> None:
    agent: Link = await link("crash")
    agent.send("start", attempt=1, config_text=CONFIG_TEXT, fresh=False, launch=None)
    ended = await agent.next("exit")
    assert ended["returncode"] == 1 and ended["error"] == "ValueError: deliberate failure"
    assert "ValueError: deliberate failure" in ended["log_lines"]


async def test_agent_stops_its_trainer_when_its_stdin_ends(link: Callable[..., Any]) -> None:
    agent: Link = await link("hang")
    agent.send("start", attempt=1, config_text=CONFIG_TEXT, fresh=False, launch=None)
    pid = (await agent.next("started"))["pid"]
    await agent.next("event")  # hello: the trainer is up
    assert alive(pid)
    assert agent.proc.stdin is not None
    agent.proc.stdin.close()
    rest = await agent.rest()
    assert await asyncio.wait_for(agent.proc.wait(), 20) == 0
    assert not alive(pid)
    exits = [frame for frame in rest if frame["type"] == "exit"]
    assert exits and exits[0]["done_reason"] == "sigterm"


async def test_agent_stops_on_request_and_serves_a_next_attempt(
    link: Callable[..., Any],
) -> None:
    agent: Link = await link("hang")
    agent.send("start", attempt=1, config_text=CONFIG_TEXT, fresh=False, launch=None)
    await agent.next("event")
    agent.send("stop", grace_s=5)
    assert (await agent.next("exit"))["returncode"] == 0
    assert [(await agent.next("event"))["frame"]["type"] for _ in range(2)] == ["step", "done"]
    agent.send("start", attempt=2, config_text=CONFIG_TEXT, fresh=False, launch=None)
    hello = (await agent.next("event"))["frame"]
    assert hello["type"] == "hello" and hello["attempt"] == 2


async def test_agent_refuses_a_bad_start_and_an_unknown_frame_and_keeps_going(
    link: Callable[..., Any],
) -> None:
    agent: Link = await link("finish")
    agent.send("start", attempt=0, config_text=CONFIG_TEXT, fresh=False, launch=None)
    assert "attempt must be an integer" in (await agent.next("error"))["message"]
    agent.send("start", attempt=1, config_text=CONFIG_TEXT, fresh=False,
               launch={"index": 5, "workers": 2})
    assert "0 <= index < workers" in (await agent.next("error"))["message"]
    agent.send("frobnicate")
    assert "unknown link frame 'frobnicate'" in (await agent.next("error"))["message"]
    agent.send("prepare")
    await agent.next("ready")


async def test_agent_ends_cleanly_on_garbage_from_the_supervisor(
    link: Callable[..., Any],
) -> None:
    agent: Link = await link("hang")
    agent.send("start", attempt=1, config_text=CONFIG_TEXT, fresh=False, launch=None)
    pid = (await agent.next("started"))["pid"]
    assert agent.proc.stdin is not None
    agent.proc.stdin.write(b"this is not json\n")
    error = await agent.next("error")
    assert error["message"].startswith("bad frame from the supervisor: frame is not JSON")
    assert await asyncio.wait_for(agent.proc.wait(), 20) == 2
    assert not alive(pid)
    assert agent.proc.stderr is not None
    stderr = (await agent.proc.stderr.read()).decode()
    assert "Traceback" not in stderr


# -- RemoteAgent over a real ssh ------------------------------------------------------


class Collected:
    def __init__(self) -> None:
        self.frames: list[tuple[int, ProtocolEvent, float | None]] = []
        self.exits: list[tuple[int, TrainerExit]] = []
        self.samples: list[tuple[int, dict[str, Any]]] = []

    def remote_agent(self, run_dir: Path, **kwargs: Any) -> RemoteAgent:
        return RemoteAgent(
            1, run_dir, python=sys.executable,
            on_frame=lambda *frame: self.frames.append(frame),
            on_exit=lambda *ended: self.exits.append(ended),
            on_sample=lambda *sample: self.samples.append(sample),
            **kwargs,
        )


def remote_config(run_dir: Path) -> Path:
    path = run_dir / "attempt-1.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(CONFIG_TEXT)
    return path


async def test_remote_agent_over_ssh_runs_a_trainer_to_its_end(
    sshd: SshServer, tmp_path: Path  # noqa: F811
) -> None:
    got = Collected()
    run_dir = tmp_path / "run"
    agent = got.remote_agent(
        run_dir, argv_prefix=sshd.prefix(), remote_dir=str(tmp_path / "there"),
        remote_env=agent_env("finish"),
    )
    try:
        host, port = await agent.prepare()
        assert host and 0 < port < 65536
        agent.start_sampling(asyncio.get_running_loop())
        await agent.start(1, remote_config(run_dir), fresh=True,
                          launch=WorkerLaunch(1, 2, {"TF_CONFIG": "{}"}))
        await until(lambda: got.exits, "the remote trainer's exit")
        assert got.exits == [(1, TrainerExit(0, done_reason="max_steps"))]
        assert [(i, e.TYPE, e.attempt) for i, e, _ in got.frames] == [
            (1, "hello", 1), (1, "step", 1), (1, "done", 1)
        ]
        assert agent.replicas == 2 and not agent.running and agent.pid is None
        # The trainer's log, written there, is copied here for `gpuwatch logs`.
        local_log = run_dir / "workers" / "1" / "trainer.log"
        assert "fake trainer: attempt 1, finish, fresh=True" in local_log.read_text()
        await until(lambda: got.samples, "a sample from the remote host")
        assert got.samples[0][0] == 1 and isinstance(got.samples[0][1].host, HostSample)
        assert agent.bad_frames == 0
    finally:
        await agent.close()
    assert agent.process is not None and agent.process.returncode == 0


async def test_remote_agent_reports_a_killed_ssh_as_a_lost_link_and_the_trainer_goes(
    sshd: SshServer, tmp_path: Path  # noqa: F811
) -> None:
    got = Collected()
    run_dir = tmp_path / "run"
    agent = got.remote_agent(
        run_dir, argv_prefix=sshd.prefix(), remote_dir=str(tmp_path / "there"),
        remote_env=agent_env("hang"),
    )
    try:
        await agent.start(1, remote_config(run_dir), fresh=False)
        await until(lambda: got.frames, "the remote trainer's hello")
        pid = agent.pid
        assert pid is not None and alive(pid)
        assert agent.process is not None
        os.kill(agent.process.pid, signal.SIGKILL)  # the ssh client, as if the network went
        started = time.monotonic()
        await until(lambda: got.exits, "the lost link", timeout_s=10)
        assert time.monotonic() - started < 5
        index, ended = got.exits[0]
        assert index == 1 and ended.link_lost is not None
        assert ended.link_lost.startswith("agent link to localhost lost: ssh killed by signal 9")
        status, fields = exit_status(ended, relaunching=False, stop_requested=False)
        assert status == "crashed" and "localhost" in fields["message"]
        assert not agent.running
        # sshd closes the session's pipes: the agent sees EOF and stops its trainer.
        await until(lambda: not alive(pid), "the remote trainer to be stopped", timeout_s=20)
    finally:
        await agent.close()


async def test_remote_agent_stop_stops_the_remote_trainer(
    sshd: SshServer, tmp_path: Path  # noqa: F811
) -> None:
    got = Collected()
    run_dir = tmp_path / "run"
    agent = got.remote_agent(
        run_dir, argv_prefix=sshd.prefix(), remote_dir=str(tmp_path / "there"),
        remote_env=agent_env("hang"),
    )
    try:
        await agent.start(1, remote_config(run_dir), fresh=False)
        await until(lambda: got.frames, "the remote trainer's hello")
        pid = agent.pid
        assert agent.stoppable and pid is not None
        await agent.stop(5.0)
        assert got.exits == [(1, TrainerExit(0, done_reason="sigterm"))]
        assert not alive(pid) and not agent.running
    finally:
        await agent.close()


async def test_remote_agent_start_fails_with_the_reason_when_ssh_cannot_connect(
    sshd: SshServer, tmp_path: Path  # noqa: F811
) -> None:
    got = Collected()
    agent = got.remote_agent(
        tmp_path / "run", argv_prefix=sshd.prefix(host="unreachable"),
    )
    with pytest.raises(AgentStartError, match="agent link to unreachable lost: ssh exited 255"):
        await agent.prepare()
    assert got.exits == [] and not agent.running


async def test_remote_agent_does_not_double_a_log_it_shares_with_its_agent(
    sshd: SshServer, tmp_path: Path  # noqa: F811
) -> None:
    # Same path there as here (a shared home; here, the same account and host, its gpuwatch
    # home resolved there to this one): one copy of each line.
    got = Collected()
    run_dir = tmp_path / "home" / "runs" / "0101-abcd"
    agent = got.remote_agent(run_dir, argv_prefix=sshd.prefix(), remote_env={
        **agent_env("finish"), "GPUWATCH_HOME": str(tmp_path / "home")
    })
    try:
        await agent.start(1, remote_config(run_dir), fresh=False)
        await until(lambda: got.exits, "the remote trainer's exit")
        text = (run_dir / "workers" / "1" / "trainer.log").read_text()
        assert text.count("fake trainer: attempt 1, finish") == 1
        assert agent.link.shared_dir and agent.dir_there == str(run_dir / "workers" / "1")
    finally:
        await agent.close()


async def test_remote_agent_says_why_the_agent_could_not_start_there(
    sshd: SshServer, tmp_path: Path  # noqa: F811
) -> None:
    got = Collected()
    agent = got.remote_agent(tmp_path / "run", argv_prefix=sshd.prefix())
    agent.python = "/nonexistent/bin/python"
    with pytest.raises(AgentStartError, match=r"lost: ssh exited 127: .*No such file"):
        await agent.start(1, remote_config(tmp_path / "run"), fresh=False)
    assert not agent.running and got.exits == []


# -- a link that talks garbage ---------------------------------------------------------


async def test_garbage_from_an_agent_is_counted_and_reads_as_a_lost_link(
    tmp_path: Path,
) -> None:
    # A stand-in "agent" that answers prepare and start, then writes junk instead of frames.
    script = tmp_path / "junk_agent.py"
    script.write_text(
        "import sys\n"
        "sys.stdin.readline()\n"
        'sys.stdout.write(\'{"v":1,"type":"ready","host":"h","port":1234,"pid":1}\\n\')\n'
        "sys.stdout.flush()\n"
        "sys.stdin.readline()\n"
        'sys.stdout.write(\'{"v":1,"type":"started","attempt":1,"pid":4242}\\n\')\n'
        'sys.stdout.write(\'{"v":1,"type":"event","frame":{"type":"run","v":1}}\\n\')\n'
        "sys.stdout.write('{\"v\":1,\"type\":\"wat\"}\\n')\n"
        "sys.stdout.write('not json at all\\n')\n"
        "sys.stdout.flush()\n"
        "sys.stderr.write('junk agent: done\\n')\n"
        "sys.stdin.read()\n"
    )
    got = Collected()
    run_dir = tmp_path / "run"
    agent = got.remote_agent(run_dir, argv_prefix=[sys.executable, str(script)])
    try:
        await agent.start(1, remote_config(run_dir), fresh=False)
        await until(lambda: got.exits, "the lost link")
        assert agent.bad_frames == 3
        assert got.frames == []
        ended = got.exits[0][1]
        assert ended.link_lost is not None and "agent link to worker 1 lost" in ended.link_lost
        assert "bad frame from the agent: frame is not JSON" in ended.link_lost
        # The link's reader ended as it should: no exception escaped it.
        task = agent.link.task
        await until(lambda: task is not None and task.done(), "the link's reader to end")
        assert task is not None and task.exception() is None
    finally:
        await agent.close()


async def test_a_link_that_ends_before_answering_start_fails_the_start_and_is_no_exit(
    tmp_path: Path,
) -> None:
    script = tmp_path / "quitter.py"
    script.write_text(
        "import sys\n"
        "sys.stdin.readline()\n"
        'sys.stdout.write(\'{"v":1,"type":"ready","host":"h","port":1234,"pid":1}\\n\')\n'
        "sys.stdout.flush()\n"
        "sys.stdin.readline()\n"
        "sys.stderr.write('quitter: out of disk\\n')\n"
        "sys.exit(3)\n"
    )
    got = Collected()
    agent = got.remote_agent(tmp_path / "run", argv_prefix=[sys.executable, str(script)])
    with pytest.raises(AgentStartError, match="python exited 3: quitter: out of disk"):
        await agent.start(1, remote_config(tmp_path / "run"), fresh=False)
    assert not agent.running and got.exits == []
    await agent.close()


# -- the agent's log relay -------------------------------------------------------------


class _Out:
    """Stands in for the agent's stdout writer: keeps what is written."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.transport = self

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data: bytes) -> None:
        self.data += data


def test_the_log_relay_is_bounded_per_second_sends_whole_lines_and_says_what_it_skipped(
    tmp_path: Path,
) -> None:
    out = _Out()
    served = _AgentProcess(tmp_path, 1, False, out)  # type: ignore[arg-type]
    line = "x" * 99
    (tmp_path / "trainer.log").write_text((line + "\n") * 10_000 + "no newline yet")
    served.relay_log()
    frames = FrameBuffer().feed(bytes(out.data))
    lines = [text for frame in frames for text in frame["lines"]]
    assert lines[0].startswith("[gpuwatch: ") and lines[0].endswith("bytes of the log not relayed]")
    assert set(lines[1:]) == {line}  # whole lines only, the newest
    assert sum(len(text) + 1 for text in lines[1:]) <= LOG_BYTES_PER_S
    assert all(len(frame["lines"]) <= 200 for frame in frames)
    out.data.clear()
    served.relay_log(final=True)  # the trainer exited: its last, unfinished line goes too
    assert FrameBuffer().feed(bytes(out.data))[-1]["lines"] == ["no newline yet"]


def test_a_link_lost_while_asked_to_stop_or_relaunch_is_that_ending_not_a_crash() -> None:
    lost = TrainerExit(1, link_lost="agent link to node-b lost: ssh killed by signal 9")
    assert exit_status(lost, relaunching=False, stop_requested=True)[0] == "stopped"
    assert exit_status(lost, relaunching=True, stop_requested=False)[0] == "relaunching"
    assert exit_status(lost, relaunching=False, stop_requested=False)[0] == "crashed"


async def test_agent_sends_a_live_change_down_and_relays_the_trainers_answer(
    link: Callable[..., Any],
) -> None:
    agent: Link = await link("hang")
    agent.send("start", attempt=1, config_text=CONFIG_TEXT, fresh=False, launch=None)
    pid = (await agent.next("started"))["pid"]
    assert [(await agent.next("event"))["frame"]["type"] for _ in range(2)] == ["hello", "step"]
    agent.send("reconfigure", id=2, attempt=2, settings={"data": {"prefetch": True}}, at_step=0)
    answer = (await agent.next("event"))["frame"]
    assert (answer["type"], answer["ok"], answer["id"], answer["attempt"]) == (
        "reconfigured", True, 2, 1
    )
    step = (await agent.next("event"))["frame"]
    assert (step["type"], step["step"], step["attempt"]) == ("step", 2, 2)
    assert alive(pid), "the same trainer goes on"
    agent.send("reconfigure", id=3, attempt=3, settings="no", at_step=0)
    assert "reconfigure:" in (await agent.next("error"))["message"]


# Real processes (a supervisor, a trainer, sshd or tmux): after the quick tests.
pytestmark = pytest.mark.slow
