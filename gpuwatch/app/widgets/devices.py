"""The devices panel (no GPU readings: the host and the replicas), and a host's devices
in a few characters (each worker's row says it too)."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text

from gpuwatch.app import fmt
from gpuwatch.app.widgets.common import is_tall, plural
from gpuwatch.app.widgets.state_panel import StatePanel
from gpuwatch.runstate import HostReading, RunState
from trainer_runtime.protocol import GpuSummary, Hello, HostSample


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
        sample = state.sample
        text = Text()
        self._no_gpu(text, state, sample, state.hello, sync)
        self.set_text(text)

    def _no_gpu(
        self,
        text: Text,
        state: RunState,
        sample: HostReading | None,
        hello: Hello | None,
        sync: float | None,
    ) -> None:
        replicas = state.replicas
        kind = hello.device_kind if hello is not None else "cpu"
        reason = sample.nvml if sample is not None else None
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
        host = sample.host if sample is not None else HostSample()
        text.append_text(host_line(state, host, self.content_size.width))
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


def host_line(state: RunState, host: HostSample, width: int = 0) -> Text:
    """'host CPU 64% of 16 cores  memory 5.0/15.6 GiB  load 1.9  trainer 1.2 cores, 1.2 GiB
    RSS': each CPU figure says what it is of (the host's: of all its cores; the trainer's:
    cores' worth, as top's 120% is). Once the run has ended, no figure of its trainer. The
    load gives way when the line is wider than `width` (0: any).
    """
    cores = len(host.per_cpu_pct)
    for with_load in (True, False):
        text = Text("host CPU ", style="dim")
        text.append(fmt.pct(host.cpu_pct), style="bold")
        text.append(f" of {plural(cores, 'core')}" if cores else " of all cores", style="dim")
        text.append("  memory ", style="dim")
        text.append(fmt.mem_pair(host.mem_used_bytes, host.mem_total_bytes))
        if with_load and host.load_1m is not None:
            text.append("  load ", style="dim")
            text.append(f"{host.load_1m:.1f}")
        cpu_pct, rss = host.run_cpu_pct, host.run_rss_bytes
        who = "command" if state.command is not None else "trainer"  # gpuwatch run's: its own
        if state.terminal:
            text.append(f"  {who} exited", style="dim")  # its last sample is not its now
        elif cpu_pct is not None or rss is not None:
            text.append(f"  {who} ", style="dim")
            figures = [f"{cpu_pct / 100.0:.1f} cores"] if cpu_pct is not None else []
            figures += [f"{fmt.bytes_binary(rss)} RSS"] if rss is not None else []
            text.append(", ".join(figures))
        if host.spare_rss_bytes is not None:
            # The spare trainer waiting for `r` (only while a dashboard is attached).
            text.append("  spare trainer ", style="dim")
            text.append(f"{fmt.bytes_binary(host.spare_rss_bytes)}")
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


def _sum_rate(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _summed_devices(summed: GpuSummary, wide: bool) -> str:
    """device_summary of a lean sample's gpu_summary (past 8 workers): the same words."""
    count = summed.count - summed.lost
    utils = summed.util_gpu_pct
    util = fmt.pct(utils[1]) if utils is not None and len(utils) == 3 else fmt.NA
    used, total = summed.mem_used_bytes, summed.mem_total_bytes
    mem = fmt.pct(100.0 * used / total) if used is not None and total else fmt.NA
    text = f"{count} GPU {util} mem {mem}"
    if wide:
        text += (f"  PCIe {fmt.format_rate(summed.pcie_bytes_per_s)}"
                 f"  NVLink {fmt.format_rate(summed.nvlink_bytes_per_s)}")
    return text


def device_summary(sample: HostReading | None, wide: bool = False) -> str:
    """A host's devices in a few characters: '2 GPU 92% mem 53%' or 'CPU 95% mem 33%'.

    Mean GPU utilization and memory used of all its GPUs; ``wide`` adds the host's
    PCIe and NVLink traffic (TX + RX over its GPUs), or its load, for 120+ columns.
    """
    if not sample:
        return fmt.NA
    gpus = [g for g in sample.gpus if not g.lost]
    if gpus:
        utils = [g.util_gpu_pct for g in gpus if g.util_gpu_pct is not None]
        used = sum(g.mem_used_bytes or 0 for g in gpus)
        total = sum(g.mem_total_bytes or 0 for g in gpus)
        util = fmt.pct(sum(utils) / len(utils)) if utils else fmt.NA
        mem = fmt.pct(100.0 * used / total) if total else fmt.NA
        summary = f"{len(gpus)} GPU {util} mem {mem}"
        if wide:
            pcie = _sum_rate(v for g in gpus for v in (g.pcie_tx_bytes_per_s,
                                                       g.pcie_rx_bytes_per_s))
            nvlink = _sum_rate(v for g in gpus for v in (g.nvlink_tx_bytes_per_s,
                                                         g.nvlink_rx_bytes_per_s))
            summary += f"  PCIe {fmt.format_rate(pcie)}  NVLink {fmt.format_rate(nvlink)}"
        return summary
    summed = sample.gpu_summary
    if summed is not None and summed.count:
        return _summed_devices(summed, wide)
    host = sample.host
    in_use, of = host.mem_used_bytes, host.mem_total_bytes
    mem = fmt.pct(100.0 * in_use / of) if in_use is not None and of else fmt.NA
    summary = f"CPU {fmt.pct(host.cpu_pct)} mem {mem}"
    if wide and host.load_1m is not None:
        summary += f"  load {host.load_1m:.1f}"
    return summary
