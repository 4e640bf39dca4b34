"""A remote worker's files live under its own account's gpuwatch home there, not at this
host's run-directory path (issue 21: ``alice@gpu-b`` has another home).

- where a worker's directory is, decided on the far side (unit tests: the run id, the
  account's GPUWATCH_HOME / XDG_STATE_HOME / home, 0700 directories);
- ``user@localhost`` is another account of this host: reached over ssh, its own home;
- an agent that cannot make its directory says so in one line, naming it and the account;
- the drill: a real second account (tests/support/sshd.py's ``second_account``) through a
  real sshd as ``NAME@localhost``, real TensorFlow workers: both train, the worker's files
  are in NAME's home, its log reaches ``gpuwatch logs`` here, a kill of its trainer is a
  crash naming it, a relaunch resumes it from its own scratch checkpoint there, and a stop
  leaves no process of either account.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.config import ConfigError
from gpuwatch.runs import folders
from gpuwatch.runs.folders import RunError, agent_worker_dir, ensure_private_tree, pid_alive
from gpuwatch.supervisor.agent import AgentStartError
from gpuwatch.supervisor.cluster import plan_workers, ssh_prefix
from gpuwatch.supervisor.remote_agent import RemoteAgent
from tests.conftest import gpuwatch, wait_for
from tests.integration.test_multiworker_live import (
    CONFIG,
    contiguous,
    last_step,
    of,
    the_run,
    trainer_pids,
)
from tests.integration.test_remote_agent import Collected, agent_env
from tests.integration.test_resume_attach import supervisor_gone
from tests.support.sshd import Account, SshServer, second_account, sshd_two_accounts  # noqa: F401
from trainer_runtime.schema import RunConfig

TIMEOUT_S = 10


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- where a worker's directory is, there ----------------------------------------------


def test_a_workers_directory_there_is_under_that_accounts_own_gpuwatch_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUWATCH_HOME", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "alice"))
    assert agent_worker_dir("1124-abcd", 1) == (
        tmp_path / "alice/.local/state/gpuwatch/runs/1124-abcd/workers/1"
    )
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert agent_worker_dir("1124-abcd", 2) == tmp_path / "state/gpuwatch/runs/1124-abcd/workers/2"
    monkeypatch.setenv("GPUWATCH_HOME", str(tmp_path / "gw"))
    assert agent_worker_dir("1124-abcd", 3) == tmp_path / "gw/runs/1124-abcd/workers/3"
    # Worker 0 under srun is the chief: the run's own directory there.
    assert agent_worker_dir("1124-abcd", 0) == tmp_path / "gw/runs/1124-abcd"


@pytest.mark.parametrize("run_id", ["", ".", "..", "a/b", "../x", "a\nb", "x" * 256])
def test_a_run_id_names_one_directory_below_runs_and_no_more(run_id: str) -> None:
    with pytest.raises(ValueError, match="not a run id"):
        agent_worker_dir(run_id, 1)


def test_the_directories_made_on_the_way_are_private_and_existing_ones_left_alone(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "home"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    target = shared / ".local/state/gpuwatch/runs/r/workers/1"
    assert ensure_private_tree(target) == target
    made = [target, *target.parents[:6]]  # workers/1 up to .local
    assert made[-1] == shared / ".local"
    assert {directory: mode(directory) for directory in made} == dict.fromkeys(made, 0o700)
    assert mode(shared) == 0o755
    assert ensure_private_tree(target) == target  # again: nothing to do
    (shared / "file").write_text("")
    with pytest.raises(RunError, match="is not a directory"):
        ensure_private_tree(shared / "file")


def test_a_workers_directory_that_another_account_owns_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another account needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)  # nobody
    with pytest.raises(RunError, match="belongs to uid 65534, not to you"):
        ensure_private_tree(theirs)


def test_remote_agents_name_the_run_and_let_the_far_side_find_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUWATCH_TRAINER_MODULE", raising=False)
    def agent(**kwargs: Any) -> RemoteAgent:
        return RemoteAgent(
            1, tmp_path / "runs" / "1124-abcd", argv_prefix=list(ssh_prefix("alice@gpu-b")),
            python="/opt/gw/bin/python", on_frame=lambda *a: None, on_exit=lambda *a: None,
            on_sample=lambda *a: None, **kwargs,
        )

    assert agent().command()[-1] == (
        "/opt/gw/bin/python -m gpuwatch.supervisor.remote --run-id 1124-abcd --index 1"
    )
    assert "--run-dir /scratch/w1 " in agent(remote_dir="/scratch/w1").command()[-1]
    # Here, its directory holds the log its agent relays.
    assert agent().log_path == tmp_path / "runs/1124-abcd/workers/1/trainer.log"


def cluster(workers: list[str], launcher: str = "ssh") -> RunConfig:
    return RunConfig.model_validate({"cluster": {"launcher": launcher, "workers": workers}})


def test_another_account_of_this_host_is_reached_over_ssh_and_its_host_sampled_once(
    tmp_path: Path,
) -> None:
    plans = plan_workers(cluster(["localhost", "alice@localhost", "localhost"]), tmp_path)
    assert [(p.kind, p.host, p.sample) for p in plans] == [
        ("local", "localhost", True),
        ("remote", "alice@localhost", False),  # the same machine: worker 0 samples it
        ("local", "localhost", False),
    ]
    assert plans[1].argv_prefix[-2:] == ("--", "alice@localhost")


def test_the_local_launcher_refuses_a_worker_that_names_an_account() -> None:
    with pytest.raises((ConfigError, ValueError), match="names an account"):
        cluster(["localhost", "alice@localhost"], launcher="local")


# -- an agent that cannot make its directory -------------------------------------------


async def test_an_agent_that_cannot_make_its_directory_says_which_and_as_whom(
    tmp_path: Path,
) -> None:
    # A file where a directory should be: refused even to root.
    (tmp_path / "home").write_text("not a directory\n")
    got = Collected()
    agent = got.remote_agent(  # no launcher: the agent's own command, run here
        tmp_path / "run", argv_prefix=[],
        remote_env={**agent_env("finish"), "GPUWATCH_HOME": str(tmp_path / "home")},
    )
    try:
        with pytest.raises(AgentStartError) as raised:
            await agent.prepare()
    finally:
        await agent.close()
    message = str(raised.value)
    assert "\n" not in message
    assert re.search(
        rf"could not make this worker's directory {tmp_path}/home/runs/run/workers/1 as "
        rf"\S+: Not a directory \({tmp_path}/home/runs\)$", message
    ), message


# -- the drill: a second account through a real sshd -----------------------------------


def drill_config(tmp_path: Path, server: SshServer, account: Account) -> Path:
    config = tmp_path / "two-homes.yaml"
    config.write_text(CONFIG.format(
        max_steps=100000,
        cluster=(
            f"  launcher: ssh\n  workers: [localhost, {account.name}@localhost]\n"
            f"  timeout_s: {TIMEOUT_S}\n  python: {sys.executable}\n"
            f"  ssh_options: ['-F', '{server.client_config}']\n"
        ),
    ))
    return config


@pytest.mark.slow
def test_a_worker_of_another_account_keeps_its_files_in_its_own_home_and_trains(
    home: Path, tmp_path: Path, sshd_two_accounts: SshServer,  # noqa: F811
    second_account: Account,  # noqa: F811
) -> None:
    account = second_account
    started = gpuwatch("train", str(drill_config(tmp_path, sshd_two_accounts, account)),
                       "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    info = the_run(home)
    run_dir = info.run_dir

    def where_it_is() -> str:
        return (f"status {folders.read_run_info(run_dir).status}; supervisor.log ends: "
                f"{(run_dir / 'supervisor.log').read_text()[-3000:]}")

    wait_for(lambda: min(last_step(run_dir, w, 1) for w in (0, 1)) >= 45, 240,
             lambda: f"45 steps on both workers ({where_it_is()})")
    for worker in (0, 1):
        steps = contiguous(run_dir, worker, 1)
        assert steps == list(range(1, len(steps) + 1)), f"worker {worker}: {steps[:20]}"

    # Worker 1's files: in the account's own gpuwatch home, its own and private.
    state = account.home / ".local" / "state" / "gpuwatch"
    there = state / "runs" / info.run_id / "workers" / "1"
    for directory in (state, state / "runs", there.parent.parent, there.parent, there):
        assert directory.stat().st_uid == account.uid and mode(directory) == 0o700, directory
    assert (there / "attempt-1.yaml").stat().st_uid == account.uid
    assert "=== gpuwatch: attempt 1 starting" in (there / "trainer.log").read_text()
    wait_for(lambda: list((there / "checkpoints").glob("ckpt-*.index")), 30,
             "worker 1's scratch checkpoints there")
    # ... and not at this host's run-directory path: there, only the relayed log.
    here = run_dir / "workers" / "1"
    assert sorted(p.name for p in here.iterdir()) == ["trainer.log"]
    logs = gpuwatch("logs", info.run_id, "--worker", "1", check=True).stdout
    assert "=== gpuwatch: attempt 1 starting" in logs
    assert f"keeps its files in {there} there" in (run_dir / "supervisor.log").read_text()

    # The kill drill, as for local workers: the run crashes naming worker 1 and its host.
    pids = trainer_pids(run_dir, 1)
    assert set(pids) == {0, 1}
    assert Path(f"/proc/{pids[1]}").stat().st_uid == account.uid
    os.kill(pids[1], signal.SIGKILL)
    wait_for(lambda: folders.read_run_info(run_dir).status == "crashed", TIMEOUT_S + 10,
             "the run to be crashed")
    (crash,) = of(run_dir, "status", status="crashed")
    assert crash["worker"] == 1, crash
    assert crash["message"].startswith(f"worker 1 ({account.name}@localhost)"), crash
    assert "SIGKILL" in crash["message"]
    wait_for(lambda: not any(pid_alive(pid) for pid in pids.values()), 15, "no trainer left")
    checkpoints = [e["step"] for e in of(run_dir, "checkpoint", worker=0, attempt=1)]
    assert checkpoints

    # Nobody follows the run, so its supervisor exits once it has ended (a `relaunch` sent
    # to it then races that exit): `gpuwatch resume` goes on with it, as a person would.
    # Both workers resume; worker 1 from its own scratch copy there.
    wait_for(lambda: supervisor_gone(run_dir), 30, "the ended run's supervisor to exit")
    resumed = gpuwatch("resume", info.run_id, "--detach")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    wait_for(lambda: min(last_step(run_dir, w, 2) for w in (0, 1)) >= checkpoints[-2:][0] + 5,
             240, "attempt 2 to train on both workers")
    resumes = {e["worker"]: e for e in of(run_dir, "resume", attempt=2)}
    assert set(resumes) == {0, 1}
    # The chief's latest, or (SIGKILLed while it saved, worker 1 may lack that one) the
    # one before it: the newest step both have.
    (resumed,) = {e["from_step"] for e in resumes.values()}
    assert resumed in checkpoints[-2:]
    assert resumes[1]["checkpoint"] == str(there / "checkpoints" / f"ckpt-{resumed}")
    for worker in (0, 1):
        steps = contiguous(run_dir, worker, 2)
        assert steps[0] == resumed + 1

    # A stop leaves nothing running, of either account.
    pids2 = trainer_pids(run_dir, 2)
    assert gpuwatch("stop", info.run_id).returncode == 0
    # Generous: on a loaded 2-core box a stop that needs its SIGKILL path is slow too.
    wait_for(lambda: folders.read_run_info(run_dir).status == "stopped", 180,
             lambda: f"stopped ({where_it_is()})")
    wait_for(lambda: not any(pid_alive(pid) for pid in pids2.values()), 60, "no trainer left")
    wait_for(lambda: not account.processes(), 30,
             lambda: f"no process of {account.name} left: {account.processes()}")
    assert not folders.read_run_info(run_dir).live


def test_a_worker_whose_account_cannot_make_its_state_directory_fails_the_start_in_one_line(
    home: Path, tmp_path: Path, sshd_two_accounts: SshServer,  # noqa: F811
    second_account: Account,  # noqa: F811
) -> None:
    account = second_account
    # Its ~/.local is not its own to write in: ~/.local/state cannot be made.
    local = account.home / ".local"
    local.mkdir(exist_ok=True)
    os.chown(local, 0, 0)
    local.chmod(0o755)
    config = drill_config(tmp_path, sshd_two_accounts, account)
    done = gpuwatch("train", str(config), "--headless", "--max-steps", "5", timeout_s=180)
    assert done.returncode != 0
    info = the_run(home)
    (failed,) = [e for e in of(info.run_dir, "status") if e["status"] in ("failed", "crashed")]
    path = account.home / ".local/state/gpuwatch/runs" / info.run_id / "workers/1"
    message = failed["message"]
    assert "\n" not in message
    assert message.startswith(f"worker 1 ({account.name}@localhost): "), message
    assert f"could not make this worker's directory {path} as {account.name}" in message
    assert f"Permission denied ({account.home}/.local/state)" in message
    assert message in done.stdout + done.stderr
    wait_for(lambda: not account.processes(), 30,
             lambda: f"no process of {account.name} left: {account.processes()}")
