"""supervisor/ports.py: a TensorFlow worker's port comes from outside the kernel's ephemeral
range (where any process's outgoing connection may take it while the trainer imports
TensorFlow) and is held, bound, until the trainer starts; the trainer names a port it
could not listen on."""

from __future__ import annotations

import json
import random
import socket
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwatch.supervisor.agent import LocalAgent
from gpuwatch.supervisor.ports import (
    DEFAULT_EPHEMERAL,
    LOWEST,
    candidate_ports,
    ephemeral_range,
    hold,
    reserve_port,
    reserve_ports,
)
from tests.support.ports import can_bind

# A reservation left unreleased would be a socket leaked: make it fail here (a socket's
# ResourceWarning comes from its finalizer, which pytest reports as unraisable).
pytestmark = [pytest.mark.filterwarnings("error::ResourceWarning"),
              pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")]


def test_the_range_is_read_from_the_kernel_and_a_bad_file_means_linuxs_default(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text("40000\t50000\n")
    assert ephemeral_range(path) == (40000, 50000)
    for text in ("", "garbage", "50000 40000", "0 70000", "1 2 3"):
        path.write_text(text)
        assert ephemeral_range(path) == DEFAULT_EPHEMERAL, text
    assert ephemeral_range(tmp_path / "missing") == DEFAULT_EPHEMERAL


def test_a_reserved_port_is_outside_the_range_and_held_until_released() -> None:
    first, last = ephemeral_range()
    held = reserve_ports(8)
    try:
        ports = [reservation.port for reservation in held]
        assert len(set(ports)) == len(ports)
        for port in ports:
            assert LOWEST <= port <= 65535 and not first <= port <= last, port
            assert not can_bind(port), f"port {port} is not held"
    finally:
        for reservation in held:
            reservation.release()
            reservation.release()  # again: harmless
    assert any(can_bind(port) for port in ports)


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6], ids=["ipv4", "ipv6"])
def test_a_port_another_program_holds_on_either_family_is_not_held_again(
    family: socket.AddressFamily,
) -> None:
    with reserve_port() as probe:
        port = probe.port
    with socket.socket(family, socket.SOCK_STREAM) as other:
        if family == socket.AF_INET6:
            other.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            other.bind(("::" if family == socket.AF_INET6 else "", port))
        except OSError as exc:  # IPv6 switched off here; the IPv4 case still runs
            pytest.skip(f"cannot listen on {family.name} here: {exc.strerror}")
        other.listen()
        assert hold(port) is None, f"port {port} is held by another program on {family.name}"
    again = hold(port)  # once that program has gone, it is free to hold
    assert again is not None and again.port == port
    again.release()


def test_a_taken_port_is_never_handed_out_and_with_none_left_the_kernel_picks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Only LOWEST lies outside this range: hold it, and the reservation falls back to a
    # port of the kernel's own choosing, with a warning, rather than one that is in use.
    ephemeral = (LOWEST + 1, 65535)
    assert [list(r) for r in candidate_ports(ephemeral)] == [[LOWEST]]
    with reserve_port(ephemeral) as first, reserve_port(ephemeral) as second:
        assert first.port != second.port
        if first.port == LOWEST:  # nothing else on the box held it
            assert "one from the kernel" in caplog.text
    # No room outside the range at all: the kernel picks, and says so.
    with reserve_port((1, 65535)) as anywhere:
        assert 0 < anywhere.port < 65536 and not can_bind(anywhere.port)


@given(first=st.integers(1, 65535), span=st.integers(0, 65535), seed=st.integers(0, 2**32))
def test_candidates_are_exactly_the_ports_from_lowest_outside_the_ephemeral_range(
    first: int, span: int, seed: int
) -> None:
    last = min(65535, first + span)
    ranges = candidate_ports((first, last))
    for r in ranges:
        assert len(r) > 0 and r.start >= LOWEST and r.stop <= 65536
        assert r.stop - 1 < first or r.start > last, (r, first, last)
    covered = sum(len(r) for r in ranges)
    assert covered == sum(1 for port in range(LOWEST, 65536) if not first <= port <= last)
    if ranges:
        port = random.Random(seed).choice(random.Random(seed).choice(ranges))
        assert port >= LOWEST and not first <= port <= last


async def test_a_local_worker_holds_its_port_from_prepare_until_its_trainer_starts(
    tmp_path: Path,
) -> None:
    agent = LocalAgent(0, tmp_path, on_frame=lambda *a: None, on_exit=lambda *a: None,
                       on_sample=lambda *a: None)
    host, port = await agent.prepare()
    assert host == "localhost"
    first, last = ephemeral_range()
    assert not first <= port <= last
    assert not can_bind(port)
    # A second prepare (a relaunch's) lets the old port go and holds a new one.
    _, again = await agent.prepare()
    assert can_bind(port) and not can_bind(again)
    # A stop before any trainer started (the attempt was stopped, another worker failed)
    # lets it go too.
    await agent.stop(1.0)
    assert can_bind(again)


GRPC_FAILED = "Could not start gRPC server"


def test_a_server_that_could_not_start_names_this_workers_port() -> None:
    from trainer_runtime.__main__ import _runtime_message

    tf_config = json.dumps({"cluster": {"worker": ["node-a:23456", "node-b:23457"]},
                            "task": {"type": "worker", "index": 1}})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TF_CONFIG", tf_config)
        line = _runtime_message(RuntimeError(GRPC_FAILED))
    assert line == (
        "RuntimeError: Could not start gRPC server: port 23457 (node-b:23457, this worker's "
        "in TF_CONFIG) is probably in use by another program: free it, or relaunch (each "
        "attempt takes a new port unless cluster.ports or Slurm's port base fixes it)")


@given(st.one_of(st.none(), st.text(max_size=200),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                              lambda inner: st.lists(inner, max_size=3)
                              | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                              max_leaves=12).map(json.dumps)))
def test_any_tf_config_gives_one_line_for_a_server_that_could_not_start(
    tf_config: str | None,
) -> None:
    from trainer_runtime.__main__ import _server_not_started

    line = _server_not_started(tf_config)
    assert line.startswith(GRPC_FAILED) and "\n" not in line and len(line) < 400


def test_a_tf_config_address_with_a_line_break_or_of_any_length_stays_one_short_line() -> None:
    from trainer_runtime.__main__ import _server_not_started

    for address in ("evil\nhost:1", "x" * 5000 + ":1", "   "):
        tf_config = json.dumps({"cluster": {"worker": [address]}, "task": {"index": 0}})
        line = _server_not_started(tf_config)
        assert line.startswith(GRPC_FAILED) and "\n" not in line and len(line) < 400, line
