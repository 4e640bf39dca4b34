"""What TensorFlow sees in the trainer's interpreter, as one line of JSON on stdout.

Run by ``gpuwatch doctor`` as ``python -m trainer_runtime.doctor`` so that the
gpuwatch process never imports TensorFlow. Always prints JSON and exits 0 when
it could print it: {"python", "tensorflow" (version or null), "error" (why TF
could not be imported, or null), "built_with_cuda", "gpus" [names],
"cuda_version", "cudnn_version"}.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from typing import Any

# TF's C++ start-up chatter goes to stderr; keep it short in the doctor's output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def probe() -> dict[str, Any]:
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "tensorflow": None,
        "error": None,
        "built_with_cuda": None,
        "gpus": [],
        "cuda_version": None,
        "cudnn_version": None,
    }
    try:
        import tensorflow as tf
    except Exception as exc:  # ImportError, or a broken install failing on import
        report["error"] = f"{type(exc).__name__}: {exc}"
        return report
    report["tensorflow"] = tf.__version__
    try:
        report["built_with_cuda"] = bool(tf.test.is_built_with_cuda())
        build = tf.sysconfig.get_build_info()
        report["cuda_version"] = build.get("cuda_version")
        report["cudnn_version"] = build.get("cudnn_version")
    except Exception as exc:
        report["error"] = f"build info: {exc}"
    try:
        report["gpus"] = [d.name for d in tf.config.list_physical_devices("GPU")]
    except Exception as exc:
        report["error"] = f"listing GPUs: {exc}"
    return report


def main() -> int:
    print(json.dumps(probe()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
