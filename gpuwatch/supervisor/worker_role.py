"""What one worker's trainer needs to join its cluster: pure data, no processes.

A single-host run launches its one trainer with no WorkerLaunch. A cluster run
gives each agent one: its worker index, the cluster's size, and the environment
its trainer joins the cluster with (``TF_CONFIG``, under every launcher).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class WorkerLaunch:
    index: int  # 0 is the chief
    workers: int
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_chief(self) -> bool:
        return self.index == 0


def tf_config(addresses: Sequence[str], index: int) -> str:
    """TF_CONFIG for worker `index` of a cluster of `addresses` ("host:port", chief first)."""
    return json.dumps(
        {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}}
    )
