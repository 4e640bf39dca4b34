"""The gpuwatch dashboard (Textual). Importing this package is cheap: Textual loads on use."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuwatch.follow.link import RunLink
    from gpuwatch.runs.folders import RunInfo


def run_dashboard(
    home: Path,
    run_id: str,
    socket_path: Path | None = None,
    *,
    record: RunInfo | None = None,
    link: RunLink | None = None,
) -> str:
    """Show the dashboard for a run until the person quits.

    Follows the run's supervisor at socket_path; or, with `record` (a run that has
    ended, no supervisor), shows the run from its directory, where `r` resumes it
    (RecordLink); or follows `link`.

    Returns "detach" (run left as it was), "ended" (closed on a run that has ended),
    "stopped" (stop sent and acknowledged) or "stop" (stop asked for but not
    acknowledged: the caller should stop it).
    """
    from gpuwatch.app.app import GpuwatchApp
    from gpuwatch.app.painters import READ_INTERVAL_S
    from gpuwatch.app.repaint import CPU_BUDGET_PCT
    from gpuwatch.follow.link import RecordLink
    from gpuwatch.runs.folders import read_run_info, runs_root, socket_path_for

    def live_link(path: Path) -> RecordLink:
        # Frames are read once per repaint: a busy run wakes the dashboard per batch. Once
        # the supervisor is gone (the run ended, or it was killed), the record.
        info = read_run_info(runs_root(home) / run_id)
        return RecordLink.live_first(info, path, read_interval_s=READ_INTERVAL_S)

    def link_for(info: RunInfo) -> RunLink:
        path = info.socket_path or socket_path_for(info.run_id, home)
        return RecordLink.live_first(info, path, read_interval_s=READ_INTERVAL_S)

    if link is None:
        if record is not None:
            link = RecordLink(record, read_interval_s=READ_INTERVAL_S)
        elif socket_path is not None:
            link = live_link(socket_path)
        else:
            raise ValueError("run_dashboard needs a socket_path, a record or a link")
    app = GpuwatchApp(
        link, home=home, run_id=run_id, link_for=link_for, cpu_budget_pct=CPU_BUDGET_PCT
    )
    result = app.run()
    return result or "detach"
