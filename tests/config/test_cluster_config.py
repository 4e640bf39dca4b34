"""The `cluster:` section: every setting bounded and located, hostile hosts refused.

The numeric settings of a worker's own input pipeline (`cluster.workers[i].data`) are
found by the same walk as every other setting (tests/config/test_config_limits.py); here each is
given values past its bounds in a file and by `--set`, and must be refused with one line
naming `cluster.workers[i].data.KEY` at its line.
"""

from __future__ import annotations

import math
import string
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from gpuwatch.config import (
    ConfigError,
    apply_overrides,
    dump_config,
    expected_replicas,
    load_config,
)
from tests.config.test_config import assert_clean
from tests.config.test_config_limits import (
    BASE,
    BASE_TEXT,
    HYPOTHESIS,
    IN_LISTS_OF_SECTIONS,
    NumericSetting,
    past_bounds,
    refusal,
    yaml_text,
)
from trainer_runtime.schema import HOST_RE, MAX_WORKERS, RunConfig


def write(tmp_path: Path, cluster_text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(BASE_TEXT + "cluster:\n" + cluster_text, encoding="utf-8")
    return path


def line_in(path: Path, needle: str) -> int:
    """The line of the last `needle` (the cluster section is at the end of the file)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return max(i for i, line in enumerate(lines, 1) if needle in line)


def test_the_walk_finds_the_numbers_of_a_workers_own_pipeline() -> None:
    found = {setting.key for setting in IN_LISTS_OF_SECTIONS}
    assert {
        "cluster.workers.0.data.read_latency_ms",
        "cluster.workers.0.data.decode_cost",
        "cluster.workers.0.data.prefetch",
        "cluster.workers.0.data.parallel_calls",
    } == found


EDGES = [
    pytest.param(setting, value, id=f"{setting.key}={what}")
    for setting in IN_LISTS_OF_SECTIONS
    for what, value in past_bounds(setting)
]


@pytest.mark.parametrize(("setting", "value"), EDGES)
def test_a_workers_pipeline_setting_past_a_bound_is_refused_at_its_line(
    tmp_path: Path, setting: NumericSetting, value: Any
) -> None:
    name = setting.key.rsplit(".", 1)[1]
    path = write(
        tmp_path,
        "  workers:\n    - host: localhost\n    - host: localhost\n      data:\n"
        f"        {name}: {yaml_text(value)}\n",
    )
    message = refusal(load_config, path)
    key = f"cluster.workers[1].data.{name}"
    assert message.startswith(f"{path}:{line_in(path, name + ':')}: {key}: "), message
    # The same by --set, on a file that has the list.
    plain = write(tmp_path, "  workers:\n    - localhost\n    - host: localhost\n")
    override = f"cluster.workers.1.data.{name}={yaml_text(value)}"
    message = refusal(load_config, plain, [override])
    assert message.startswith(f"--set {override}: {key}: "), message


def test_a_workers_own_pipeline_settings_load(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "  workers:\n    - localhost\n    - host: localhost\n      data:\n"
        "        read_latency_ms: 8\n        prefetch: on\n        parallel_calls: auto\n",
    )
    cluster = load_config(path).config.cluster
    assert cluster is not None
    assert cluster.workers[0].data.given() == {}
    assert cluster.workers[1].data.given() == {
        "read_latency_ms": 8.0,
        "prefetch": True,
        "parallel_calls": "autotune",
    }


@pytest.mark.parametrize(
    ("cluster_text", "needle", "key", "words"),
    [
        ("  workers: 0\n", "workers:", "cluster.workers", "must be from 1 to 256"),
        (f"  workers: {MAX_WORKERS + 1}\n", "workers:", "cluster.workers", "must be from 1"),
        ("  workers: [localhost, gpu2]\n", "workers:", "cluster.workers[1].host", "another host"),
        ("  launcher: local\n  workers:\n    - localhost\n    - gpu2\n", "- gpu2",
         "cluster.workers[1].host", "the local launcher runs workers on this one"),
        ("  launcher: ssh\n  workers: [a, '-oProxyCommand=sh']\n", "workers:",
         "cluster.workers[1].host", "must be a host name"),
        ("  launcher: slurm\n  workers: [node1, node2]\n", "workers:",
         "cluster.workers[0].host", "takes its hosts from the allocation"),
        ("  workers: 2\n  ports: [5000]\n", "ports:", "cluster.ports", "1 ports for 2 workers"),
        ("  workers: 2\n  ports: [5000, 5000]\n", "ports:", "cluster.ports",
         "gives port 5000 twice on localhost"),
        ("  timeout_s: 0\n", "timeout_s:", "cluster.timeout_s", "must be at least 1"),
        ("  collective: mpi\n", "collective:", "cluster.collective", "auto"),
        ("  launcher: kubernetes\n", "launcher:", "cluster.launcher", "local"),
        ("  hosts: 2\n", "hosts:", "cluster.hosts", ""),
        ("  ssh_options: -p 22\n", "ssh_options:", "cluster.ssh_options", ""),
        ("  launcher: ssh\n  workers: [a]\n  python: ~/venv/bin/python\n", "python:",
         "cluster.python", "without ~"),
    ],
)
def test_a_bad_cluster_setting_is_one_line_at_its_key(
    tmp_path: Path, cluster_text: str, needle: str, key: str, words: str
) -> None:
    path = write(tmp_path, cluster_text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = assert_clean(caught.value)
    assert message.startswith(f"{path}:{line_in(path, needle)}: {key}: "), message
    assert words in message
    assert message.count("(got ") <= 1, "the value is shown once"


def test_a_saved_slurm_config_loads_back(tmp_path: Path) -> None:
    # The run directory's config.yaml has every key, each worker's default host too: the
    # supervisor reads it back (a real salloc found it refused).
    path = write(tmp_path, "  launcher: slurm\n  workers: 2\n")
    config = load_config(path).config
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(config), encoding="utf-8")
    assert load_config(saved).config == config
    with pytest.raises(ConfigError, match="takes its hosts from the allocation"):
        load_config(write(tmp_path, "  launcher: slurm\n  workers: [localhost, node2]\n"))


def test_ports_may_repeat_on_different_hosts(tmp_path: Path) -> None:
    path = write(tmp_path, "  launcher: ssh\n  workers: [gpu1, gpu2]\n  ports: [5000, 5000]\n")
    cluster = load_config(path).config.cluster
    assert cluster is not None and cluster.ports == [5000, 5000]


HOST_CHARS = string.ascii_letters + string.digits + "-._@ ;|&$`'\"\\/:\n\t*?[]{}()<>!~#%^=+,"


@HYPOTHESIS
@given(host=st.text(alphabet=HOST_CHARS, min_size=0, max_size=40))
@example(host="0\n")  # "$" matched before a last newline: the schema took it
@example(host="gpu-a\n")
def test_any_host_text_is_taken_as_a_plain_host_or_refused_in_one_line(host: str) -> None:
    """A host goes on ssh's command line: it can never be an option or carry shell syntax."""
    data = yaml.safe_load(BASE_TEXT)
    data["cluster"] = {"launcher": "ssh", "workers": [host]}
    try:
        config = RunConfig.model_validate(data)
    except Exception:
        # A folder of its own each example (hypothesis and a function-scoped tmp_path do
        # not mix), removed after it: nothing of the test is left in /tmp.
        with tempfile.TemporaryDirectory(prefix="gpuwatch-host-property-") as folder:
            path = Path(folder) / "config.yaml"
            path.write_text(
                BASE_TEXT + "cluster:\n  launcher: ssh\n  workers:\n    - " + yaml_text(host)
                + "\n",
                encoding="utf-8",
            )
            try:
                load_config(path)
            except ConfigError as exc:
                assert_clean(exc)
                return
        raise AssertionError(f"the schema refused {host!r} but loading did not") from None
    assert config.cluster is not None
    taken = config.cluster.workers[0].host
    assert HOST_RE.fullmatch(taken) and not taken.startswith("-")
    assert not set(taken) & set(" ;|&$`'\"\\/:\n\t*?[]{}()<>!~#%^=+,")


@HYPOTHESIS
@given(count=st.integers(min_value=-(10**6), max_value=10**6))
def test_any_worker_count_loads_within_bounds_or_is_refused(count: int) -> None:
    data = yaml.safe_load(BASE_TEXT)
    data["cluster"] = {"workers": count}
    if 1 <= count <= MAX_WORKERS:
        config = RunConfig.model_validate(data)
        assert config.cluster is not None and config.cluster.count == count
        assert expected_replicas(config) >= 1
    else:
        with pytest.raises(ValueError):
            RunConfig.model_validate(data)


def test_no_cluster_section_is_a_single_host_run() -> None:
    assert BASE.cluster is None


def test_a_relaunch_may_set_cluster_settings_and_is_checked_like_a_file() -> None:
    changed = apply_overrides(BASE, {"cluster.timeout_s": 30})
    assert changed.cluster is not None and math.isclose(changed.cluster.timeout_s, 30.0)
    message = refusal(apply_overrides, BASE, {"cluster.timeout_s": -1})
    assert message.startswith("relaunch: cluster.timeout_s: "), message
    message = refusal(apply_overrides, BASE, {"cluster.ports.0": 5000})
    assert message.startswith("relaunch: cluster.ports[0]: no such item"), message


def test_ports_hold_one_per_worker_up_to_the_most_workers(tmp_path: Path) -> None:
    ports = list(range(20000, 20000 + MAX_WORKERS))
    path = write(tmp_path, f"  workers: {MAX_WORKERS}\n  ports: {ports}\n")
    cluster = load_config(path).config.cluster
    assert cluster is not None and cluster.ports == ports
    path = write(tmp_path, f"  workers: {MAX_WORKERS}\n  ports: {[*ports, 30000]}\n")
    message = refusal(load_config, path)
    assert message.startswith(f"{path}:{line_in(path, 'ports:')}: cluster.ports: "), message
    assert f"at most {MAX_WORKERS}" in message
