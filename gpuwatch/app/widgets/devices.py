"""The devices panel (no GPU readings: the host and the replicas), and a host's devices
in a few characters (each worker's row says it too)."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from gpuwatch.app import fmt
from gpuwatch.app.widgets.common import is_tall, plural
from gpuwatch.app.widgets.state_panel import StatePanel
from gpuwatch.runstate import RunState
from trainer_runtime.protocol import Hello


class DevicesPanel(StatePanel):
    """No GPU readings: says so, with the host and the replicas (GpuPanel shows GPUs)."""

    _last_state: RunState | None = None
    _last_sync: float | None = None

    def on_resize(self) -> None:
        """The host line fits the new width (an ended run gets no new sample)."""
        shown = self._last_state
        if shown is not None:
            self.call_after_refresh(lambda: self.show_state(shown, self._last_sync))

    def show_state(self, state: RunState, sync: float | None) -> None:
        """sync: the gradient sync estimate of the figures on screen (RunState.figures);
        None where the all-reduce is measured (the metrics panel shows its bus bandwidth)."""
        self._last_state, self._last_sync = state, sync
        sample = state.sample or {}
        text = Text()
        self._no_gpu(text, state, sample, state.hello, sync)
        self.set_text(text)

    def _no_gpu(
        self,
        text: Text,
        state: RunState,
        sample: dict[str, Any],
        hello: Hello | None,
        sync: float | None,
    ) -> None:
        replicas = state.replicas
        kind = hello.device_kind if hello is not None else "cpu"
        reason = sample.get("nvml")
        devices = [
            d.rsplit("/", 1)[-1].removeprefix("device:")
            for d in (hello.devices if hello is not None else [])
        ]
        cluster = cluster_line(state)
        if kind == "gpu":
            text.append(f"{plural(replicas, 'GPU replica')}, but no GPU readings",
                        style="bold yellow")
            if cluster:
                text.append(f": {cluster}")
        else:
            text.append("No NVIDIA GPU found", style="bold yellow")
            if cluster:
                text.append(f": {cluster}")
            elif hello is None and state.command is not None:
                # A person's own command: its replicas are its own, told by its hook's hello.
                text.append(": the command runs on this host's CPUs")
            else:
                text.append(f": training uses {plural(replicas, 'logical CPU replica')}")
        if devices and not cluster:
            text.append(f" ({', '.join(devices)})", style="dim")
        text.append("\n")
        text.append_text(host_line(state, sample.get("host") or {}, self.content_size.width))
        if cluster and not is_tall(self):
            # A cluster on a short screen: the workers panel says each host's devices; the
            # rows go to the attempts table below (why no NVML shows at 120x40).
            return
        if sync is not None and not (sync == 0 and state.command is not None):
            # (a command's hook that cannot estimate its gradients' bytes sends none)
            text.append("\ngradient sync ", style="dim")
            text.append(fmt.format_rate(sync), style="bold")
            text.append(" (estimate)", style="dim")
            if reason:
                text.append(f"  NVML: {reason}", style="dim")
        elif reason:
            text.append(f"\nNVML: {reason}", style="dim")


def host_line(state: RunState, host: dict[str, Any], width: int = 0) -> Text:
    """'host CPU 64% of 16 cores  memory 5.0/15.6 GiB  load 1.9  trainer 1.2 cores, 1.2 GiB
    RSS': each CPU figure says what it is of (the host's: of all its cores; the trainer's:
    cores' worth, as top's 120% is). Once the run has ended, no figure of its trainer. The
    load gives way when the line is wider than `width` (0: any).
    """
    cores = len(host.get("per_cpu_pct") or ())
    for with_load in (True, False):
        text = Text("host CPU ", style="dim")
        text.append(fmt.pct(host.get("cpu_pct")), style="bold")
        text.append(f" of {plural(cores, 'core')}" if cores else " of all cores", style="dim")
        text.append("  memory ", style="dim")
        text.append(fmt.mem_pair(host.get("mem_used_bytes"), host.get("mem_total_bytes")))
        if with_load and host.get("load_1m") is not None:
            text.append("  load ", style="dim")
            text.append(f"{host['load_1m']:.1f}")
        cpu_pct, rss = host.get("run_cpu_pct"), host.get("run_rss_bytes")
        who = "command" if state.command is not None else "trainer"  # gpuwatch run's: its own
        if state.terminal:
            text.append(f"  {who} exited", style="dim")  # its last sample is not its now
        elif cpu_pct is not None or rss is not None:
            text.append(f"  {who} ", style="dim")
            figures = [f"{cpu_pct / 100.0:.1f} cores"] if cpu_pct is not None else []
            figures += [f"{fmt.bytes_binary(rss)} RSS"] if rss is not None else []
            text.append(", ".join(figures))
        if host.get("spare_rss_bytes") is not None:
            # The spare trainer waiting for `r` (only while a dashboard is attached).
            text.append("  spare trainer ", style="dim")
            text.append(f"{fmt.bytes_binary(host.get('spare_rss_bytes'))}")
        if not width or text.cell_len <= width:
            break
    return text


def cluster_line(state: RunState) -> str:
    """'2 workers x 1 CPU replica (MultiWorkerMirroredStrategy)'; '' on one host."""
    workers = state.workers
    if workers <= 1:
        return ""
    chief = state.workers_seen.get(0)
    hello = state.hello
    per_worker = chief.replicas if chief is not None else None
    if per_worker is None:
        per_worker = max(1, state.replicas // workers) if hello is not None else None
    kind = (hello.device_kind if hello is not None else "cpu").upper()
    replicas = plural(per_worker, f"{kind} replica") if per_worker else f"{kind} replicas"
    return f"{workers} workers x {replicas} (MultiWorkerMirroredStrategy)"


def _sum_rate(gpus: list[dict[str, Any]], *keys: str) -> float | None:
    values = [g[key] for g in gpus for key in keys if g.get(key) is not None]
    return sum(values) if values else None


def _summed_devices(summed: dict[str, Any], wide: bool) -> str:
    """device_summary of a lean sample's gpu_summary (past 8 workers): the same words."""
    count = int(summed.get("count") or 0) - int(summed.get("lost") or 0)
    utils = summed.get("util_gpu_pct")
    util = fmt.pct(utils[1]) if isinstance(utils, list) and len(utils) == 3 else fmt.NA
    used, total = summed.get("mem_used_bytes"), summed.get("mem_total_bytes")
    mem = fmt.pct(100.0 * used / total) if isinstance(used, int | float) and total else fmt.NA
    text = f"{count} GPU {util} mem {mem}"
    if wide:
        text += (f"  PCIe {fmt.format_rate(summed.get('pcie_bytes_per_s'))}"
                 f"  NVLink {fmt.format_rate(summed.get('nvlink_bytes_per_s'))}")
    return text


def device_summary(sample: dict[str, Any] | None, wide: bool = False) -> str:
    """A host's devices in a few characters: '2 GPU 92% mem 53%' or 'CPU 95% mem 33%'.

    Mean GPU utilization and memory used of all its GPUs; ``wide`` adds the host's
    PCIe and NVLink traffic (TX + RX over its GPUs), or its load, for 120+ columns.
    """
    if not sample:
        return fmt.NA
    gpus = [g for g in sample.get("gpus") or [] if not g.get("lost")]
    if gpus:
        utils = [g["util_gpu_pct"] for g in gpus if g.get("util_gpu_pct") is not None]
        used = sum(g.get("mem_used_bytes") or 0 for g in gpus)
        total = sum(g.get("mem_total_bytes") or 0 for g in gpus)
        util = fmt.pct(sum(utils) / len(utils)) if utils else fmt.NA
        mem = fmt.pct(100.0 * used / total) if total else fmt.NA
        summary = f"{len(gpus)} GPU {util} mem {mem}"
        if wide:
            pcie = _sum_rate(gpus, "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s")
            nvlink = _sum_rate(gpus, "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s")
            summary += f"  PCIe {fmt.format_rate(pcie)}  NVLink {fmt.format_rate(nvlink)}"
        return summary
    summed = sample.get("gpu_summary")
    if isinstance(summed, dict) and summed.get("count"):
        return _summed_devices(summed, wide)
    host = sample.get("host") or {}
    used, total = host.get("mem_used_bytes"), host.get("mem_total_bytes")
    mem = fmt.pct(100.0 * used / total) if used is not None and total else fmt.NA
    summary = f"CPU {fmt.pct(host.get('cpu_pct'))} mem {mem}"
    if wide and host.get("load_1m") is not None:
        summary += f"  load {host['load_1m']:.1f}"
    return summary
