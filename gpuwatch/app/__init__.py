"""The gpuwatch dashboard (Textual). Importing this package is cheap: Textual loads on use."""

from __future__ import annotations

from pathlib import Path


def run_dashboard(home: Path, run_id: str, socket_path: Path) -> str:
    """Show the dashboard for a run until the person quits.

    Returns "detach" (run left as it was), "stopped" (stop sent and acknowledged)
    or "stop" (stop asked for but not acknowledged: the caller should stop it).
    """
    from gpuwatch.app.app import GpuwatchApp
    from gpuwatch.app.link import SocketLink
    from gpuwatch.app.painters import READ_INTERVAL_S
    from gpuwatch.runs import RunInfo, socket_path_for

    def link(path: Path) -> SocketLink:
        # Frames are read once per repaint: a busy run wakes the dashboard per batch.
        return SocketLink(path, read_interval_s=READ_INTERVAL_S)

    def link_for(info: RunInfo) -> SocketLink:
        return link(info.socket_path or socket_path_for(info.run_id, home))

    app = GpuwatchApp(link(socket_path), home=home, run_id=run_id, link_for=link_for)
    result = app.run()
    return result or "detach"
