"""Typed events: one declaration each in trainer_runtime.protocol; encode, decode and docs follow.

The envelope ("v", "type", "seq", "t") is written by event_frame and read by
parse_event; every field of every event is checked by its declared type.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_runtime import protocol
from trainer_runtime.protocol import (
    EVENTS,
    Envelope,
    GpuProcess,
    GpuSample,
    GpuSummary,
    HostSample,
    ProtocolError,
    Sample,
    Step,
    decode,
    encode_event,
    event_reference,
    parse_event,
)

ROOT = Path(__file__).resolve().parents[2]

EXAMPLES: dict[str, dict[str, Any]] = {
    "hello": dict(attempt=1, pid=42, tf_version="2.21.0", replicas=2, device_kind="cpu",
                  devices=["CPU:0", "CPU:1"], param_count=10, param_bytes=40,
                  global_batch_size=64, accumulation_steps=1, per_replica_batch=32,
                  start_step=0, start_micro_step=0),
    "step": dict(attempt=1, step=3, micro_step=6, epoch=0, loss=0.5, lr=1e-3, examples=64,
                 step_time_ms=12.5, input_wait_ms=2.5, grad_sync_bytes=80, position=192,
                 dropped=0),
    "checkpoint": dict(attempt=1, step=25, micro_step=25, path="/r/ckpt-25", seconds=0.1),
    "resume": dict(attempt=2, from_step=25, from_micro_step=25, checkpoint="/r/ckpt-25",
                   position=1600, data_order="continued", data_note="", lost_steps=3),
    "reconfigured": dict(attempt=1, id=2, ok=True, step=40, changed=["data.prefetch"],
                         seconds=0.2, message=""),
    "done": dict(attempt=1, reason="max_steps", step=100),
    "error": dict(attempt=1, kind="runtime", message="MemoryError: x"),
    "hook": dict(attempt=1, installed=True, message="", tensorflow=True, keras_version="3.15.1",
                 loop="fit", input_wait="", strategy="MirroredStrategy"),
    "run": dict(run_id="1121-abcd", name="demo", config_path="/r/config.yaml",
                supervisor_pid=7, host="box", settings={"name": "demo"}, created=None),
    "attempt": dict(attempt=1, settings={"name": "demo"}, fresh=False, reason="start",
                    config_path="/r/attempt-1.yaml"),
    "scale": dict(counts=[1, 2, 4], unit="replicas", mode="weak", steps=40, cores=2),
    "status": dict(attempt=1, status="crashed", exit_code=1, signal=None, message="boom",
                   log_tail=["a", "b"]),
    "sample": dict(host=HostSample(cpu_pct=50.0), gpus=[], nvml="no driver"),
    "steps": dict(attempt=1, worker=9, first_step=6, last_step=45, count=40, epoch=0,
                  examples=2560, loss=0.5, position=2880, step_time_ms=[24.0, 25.0, 27.5, 1001.0],
                  input_wait_ms=[1.0, 1.2, 3.0, 50.0], compute_ms=None,
                  breakdown_ms=[1001.0, 50.0, 320.0, 500.0, 40.0]),
}


def test_every_declared_event_has_an_example_here() -> None:
    assert set(EXAMPLES) == set(EVENTS)


@pytest.mark.parametrize("name", sorted(EVENTS))
def test_each_event_round_trips_with_its_envelope(name: str) -> None:
    event = EVENTS[name](**EXAMPLES[name])
    line = encode_event(event, t=1000.5, seq=9)
    frame = decode(line)
    assert list(frame)[:4] == ["v", "type", "seq", "t"], "the envelope comes first"
    assert parse_event(frame) == (Envelope(name, 9, 1000.5), event)


def test_a_frame_without_seq_or_t_parses_with_an_empty_envelope() -> None:
    event = Step(**EXAMPLES["step"])
    envelope, parsed = parse_event(decode(encode_event(event)))
    assert (envelope.seq, envelope.t, parsed) == (None, None, event)


def test_step_figures_are_derived_once() -> None:
    step = Step(**EXAMPLES["step"])
    assert step.input_wait_pct == pytest.approx(20.0)
    assert step.examples_per_s == pytest.approx(64 * 1000 / 12.5)
    assert Step(**{**EXAMPLES["step"], "step_time_ms": 0.0}).input_wait_pct is None
    # A step time the wire accepts (finite) whose rate is not: 64 examples in 1e-310 ms.
    assert Step(**{**EXAMPLES["step"], "step_time_ms": 1e-310}).examples_per_s is None


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"step": True}, "step: step must be an integer (got true)"),
        ({"step": 1.5}, "step: step must be an integer (got 1.5)"),
        ({"loss": "x"}, 'step: loss must be a finite number or null (got "x")'),
        ({"lr": "x"}, 'step: lr must be a finite number or null (got "x")'),
        ({"step_time_ms": None}, "step: step_time_ms must be a finite number (got null)"),
        ({"extra": 1}, 'step: unknown field "extra"'),
        ({"seq": -1}, "step: seq must be an integer >= 0 (got -1)"),
        ({"t": "now"}, 'step: t must be a number (got "now")'),
    ],
)
def test_a_field_of_the_wrong_type_is_a_protocol_error_naming_it(
    change: dict[str, Any], words: str
) -> None:
    frame = {"v": 1, "type": "step", **EXAMPLES["step"], **change}
    with pytest.raises(ProtocolError) as refused:
        parse_event(frame)
    assert str(refused.value) == words


def test_a_missing_field_and_an_unknown_type_are_refused() -> None:
    frame = {"v": 1, "type": "step", **EXAMPLES["step"]}
    del frame["examples"]
    with pytest.raises(ProtocolError, match="examples"):
        parse_event(frame)
    with pytest.raises(ProtocolError, match='unknown event type "stepp"'):
        parse_event({"v": 1, "type": "stepp"})


def test_events_recorded_before_fields_were_added_still_parse() -> None:
    # The dashboard's recorded fixtures predate `position`, `config_path` and `name`.
    seen = 0
    for path in sorted((ROOT / "tests" / "app" / "data").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            parse_event(json.loads(line))
            seen += 1
    assert seen > 100


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(sorted(EVENTS)),
    key=st.text(max_size=12),
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner,
                                                                   max_size=3),
        max_leaves=6,
    ),
)
def test_any_value_in_any_field_is_an_event_of_declared_types_or_a_protocol_error(
    name: str, key: str, value: Any
) -> None:
    frame = {"v": 1, "type": name, **EXAMPLES[name], key: value}
    try:
        _, event = parse_event(frame)
    except ProtocolError:
        return
    hints = {f.name: f.type for f in dataclasses.fields(event)}
    for field_name, annotation in hints.items():
        got = getattr(event, field_name)
        base = str(annotation).removesuffix(" | None")
        if got is None:
            assert str(annotation).endswith("| None"), field_name
        elif base == "int":
            assert type(got) is int, field_name
        elif base == "float":
            assert type(got) is float, field_name
        elif base == "bool":
            assert type(got) is bool, field_name


def test_the_module_docstring_carries_the_reference_generated_from_the_declarations() -> None:
    assert protocol.__doc__ is not None and event_reference() in protocol.__doc__
    for name, cls in EVENTS.items():
        assert f"  {name} " in event_reference()
        for declared in dataclasses.fields(cls):
            assert f"{declared.name} (" in event_reference()


def test_a_number_too_big_for_a_float_is_a_protocol_error_not_an_overflow() -> None:
    frame = {"v": 1, "type": "checkpoint", **EXAMPLES["checkpoint"], "seconds": 10**400}
    with pytest.raises(ProtocolError, match="seconds must be a finite number"):
        parse_event(frame)
    with pytest.raises(ProtocolError, match="t must be a number"):
        parse_event({**frame, "seconds": 0.1, "t": 10**400})


# -- a sample's readings: the protocol's typed records, the wire's objects ---------------

# A sample as gpuwatch's sampler has always written it (byte for byte, before its
# readings were typed): the host's, a GPU's with a process, a lost GPU's.
SAMPLE_LINE = (
    '{"v":1,"type":"sample","seq":9,"t":1750000007.5,"host":{"cpu_pct":12.3,'
    '"per_cpu_pct":[10.0,14.7],"mem_used_bytes":5400000000,"mem_total_bytes":16700000000,'
    '"load_1m":1.23,"run_cpu_pct":160.1,"run_rss_bytes":1250000000,"spare_rss_bytes":null},'
    '"gpus":[{"index":0,"name":"NVIDIA H100 80GB HBM3","uuid":"GPU-0","lost":false,'
    '"mig":false,"util_gpu_pct":93,"util_mem_pct":41.3,"mem_used_bytes":61000000000,'
    '"mem_total_bytes":85000000000,"temperature_c":61.0,"power_w":512.3,'
    '"power_limit_w":700.0,"sm_clock_mhz":1980,"pcie_gen":5,"pcie_width":16,'
    '"pcie_tx_bytes_per_s":1500000000,"pcie_rx_bytes_per_s":null,'
    '"nvlink_tx_bytes_per_s":null,"nvlink_rx_bytes_per_s":25000000000,'
    '"pcie_source":"counter","nvlink_links_active":18,"nvlink_version":4,'
    '"processes":[{"pid":4242,"used_bytes":1073741824,"in_run":true}]},'
    '{"index":1,"name":null,"uuid":null,"lost":true,"mig":false,"util_gpu_pct":null,'
    '"util_mem_pct":null,"mem_used_bytes":null,"mem_total_bytes":null,"temperature_c":null,'
    '"power_w":null,"power_limit_w":null,"sm_clock_mhz":null,"pcie_gen":null,'
    '"pcie_width":null,"pcie_tx_bytes_per_s":null,"pcie_rx_bytes_per_s":null,'
    '"nvlink_tx_bytes_per_s":null,"nvlink_rx_bytes_per_s":null,"pcie_source":null,'
    '"nvlink_links_active":null,"nvlink_version":null,"processes":[]}],"nvml":null,'
    '"worker":3,"gpu_summary":null}\n'
)


def test_a_sample_round_trips_through_encode_and_parse_as_the_typed_records() -> None:
    from gpuwatch.sampling import DeviceSample, sample_event

    host = HostSample(cpu_pct=12.345, per_cpu_pct=(10.04, 14.66), mem_used_bytes=5_400_000_000,
                      mem_total_bytes=16_700_000_000, load_1m=1.234, run_cpu_pct=160.06,
                      run_rss_bytes=1_250_000_000)
    gpu = GpuSample(index=0, name="NVIDIA H100 80GB HBM3", uuid="GPU-0", util_gpu_pct=93,
                    util_mem_pct=41.26, mem_used_bytes=61_000_000_000,
                    mem_total_bytes=85_000_000_000, temperature_c=61.0, power_w=512.345,
                    power_limit_w=700.0, sm_clock_mhz=1980, pcie_gen=5, pcie_width=16,
                    pcie_tx_bytes_per_s=1.5e9 + 0.4, nvlink_tx_bytes_per_s=float("nan"),
                    nvlink_rx_bytes_per_s=2.5e10, processes=(GpuProcess(4242, 2**30, True),),
                    pcie_source="counter", nvlink_links_active=18, nvlink_version=4,
                    unavailable=(("pcie_rx_bytes_per_s", "first sample"),))
    lost = GpuSample(index=1, lost=True)
    sent = dataclasses.replace(
        sample_event(DeviceSample(0.0, host, (gpu, lost), None)), worker=3)
    line = encode_event(sent, t=1750000007.5, seq=9)
    assert line.decode() == SAMPLE_LINE  # the bytes the sampler always wrote
    envelope, parsed = parse_event(decode(line))
    assert envelope == Envelope("sample", 9, 1750000007.5) and parsed == sent
    # Field for field, what is not sent included: the supervisor folds what readers read.
    assert dataclasses.asdict(parsed) == dataclasses.asdict(sent)
    assert isinstance(parsed, Sample) and isinstance(parsed.host, HostSample)
    assert all(isinstance(g, GpuSample) for g in parsed.gpus)
    assert parsed.gpus[0].processes == (GpuProcess(pid=4242, used_bytes=2**30, in_run=True),)
    assert parsed.host.per_cpu_pct == (10.0, 14.7) and parsed.gpus[0].util_gpu_pct == 93
    assert encode_event(parsed, t=1750000007.5, seq=9) == line  # read and written: the same


def test_a_lean_sample_with_its_gpus_summed_round_trips() -> None:
    summary = GpuSummary(count=8, lost=1, util_gpu_pct=[0.0, 30.0, 60.0],
                         mem_used_bytes=4.0e10, mem_total_bytes=5.6e11,
                         pcie_bytes_per_s=None, nvlink_bytes_per_s=1.0e9)
    host = HostSample(cpu_pct=5.0, per_cpu_pct=(5.0,) * 64, mem_used_bytes=1, load_1m=0.5)
    lean = Sample(host=host.leaned(), gpus=[], nvml=None, worker=9, gpu_summary=summary)
    frame = decode(encode_event(lean))
    assert frame["host"] == {"cpu_pct": 5.0, "mem_used_bytes": 1, "mem_total_bytes": None,
                             "load_1m": 0.5}  # a summarizing worker's few readings
    assert frame["gpu_summary"]["util_gpu_pct"] == [0.0, 30.0, 60.0]
    _, parsed = parse_event(frame)
    assert parsed == lean and isinstance(parsed, Sample) and parsed.host.lean


def test_a_sample_recorded_by_an_older_gpuwatch_still_parses() -> None:
    # As 0.x recorded it: no worker, no gpu_summary, a host without spare_rss_bytes, a
    # GPU without pcie_source (and NVLink's fields before the rates), a GPU without a uuid.
    line = (
        '{"v":1,"type":"sample","seq":9,"t":1750000007.024,"host":{"cpu_pct":90.0,'
        '"per_cpu_pct":[93.0,87.0],"mem_used_bytes":5400000000,"mem_total_bytes":16700000000,'
        '"load_1m":1.9,"run_cpu_pct":160.0,"run_rss_bytes":1250000000},"gpus":[{"index":0,'
        '"name":"NVIDIA A100-SXM4-80GB","uuid":"GPU-0","lost":false,"mig":false,'
        '"util_gpu_pct":97.0,"util_mem_pct":40.0,"mem_used_bytes":70000000000,'
        '"mem_total_bytes":85000000000,"temperature_c":60.0,"power_w":300.5,'
        '"power_limit_w":400.0,"sm_clock_mhz":1410,"pcie_gen":4,"pcie_width":16,'
        '"nvlink_links_active":12,"nvlink_version":3,"pcie_tx_bytes_per_s":1000,'
        '"pcie_rx_bytes_per_s":2000,"nvlink_tx_bytes_per_s":null,"nvlink_rx_bytes_per_s":0,'
        '"processes":[{"pid":7,"used_bytes":null,"in_run":true}]},{"index":1,"name":"x"}],'
        '"nvml":null}'
    )
    envelope, sample = parse_event(json.loads(line))
    assert envelope == Envelope("sample", 9, 1750000007.024) and isinstance(sample, Sample)
    assert (sample.worker, sample.gpu_summary) == (0, None)
    assert sample.host.spare_rss_bytes is None and not sample.host.lean
    assert sample.host.run_rss_bytes == 1_250_000_000 and sample.host.per_cpu_pct == (93.0, 87.0)
    first, second = sample.gpus
    assert first.pcie_source is None and (first.nvlink_links_active, first.nvlink_version) == (
        12, 3)
    assert first.util_gpu_pct == 97.0 and first.processes == (GpuProcess(7, None, True),)
    assert (second.index, second.name, second.uuid, second.util_gpu_pct) == (1, "x", None, None)
    # And every sample of the recorded runs the dashboard's tests replay.
    samples = [parse_event(json.loads(text))[1]
               for path in sorted((ROOT / "tests" / "app" / "data").glob("*.jsonl"))
               for text in path.read_text().splitlines() if '"type":"sample"' in text]
    assert len(samples) > 20 and all(isinstance(s.host, HostSample) for s in samples)
    assert any(isinstance(g, GpuSample) for s in samples for g in s.gpus)


def test_a_newer_senders_reading_is_kept_and_a_wrong_one_refused() -> None:
    frame = {"v": 1, "type": "sample", "host": {"cpu_pct": 1.0, "swap_bytes": 0},
             "gpus": [{"index": 0, "fan_pct": 40}], "nvml": None}
    _, sample = parse_event(frame)
    assert isinstance(sample, Sample)
    assert sample.host.extra == {"swap_bytes": 0} and sample.gpus[0].extra == {"fan_pct": 40}
    again = decode(encode_event(sample))
    assert again["host"]["swap_bytes"] == 0 and again["gpus"][0]["fan_pct"] == 40
    for change, words in (
        ({"host": {"cpu_pct": "x"}}, "sample: host must be an object (HostSample) whose "
                                     'cpu_pct is a finite number or null (got an object)'),
        ({"gpus": [{"name": "x"}]}, "sample: gpus must be a list, each an object (GpuSample) "
                                    "with index (got a list)"),
        ({"gpus": [{"index": True}]}, "sample: gpus must be a list, each an object "
                                      "(GpuSample) whose index is an integer (got a list)"),
    ):
        with pytest.raises(ProtocolError) as refused:
            parse_event({**frame, **change})
        assert str(refused.value) == words
