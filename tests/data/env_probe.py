"""A stand-in trainer for the spare's tests: writes what it sees of the accelerator
variables (Python's os.environ and the C library's getenv, which CUDA reads) and exits."""

from __future__ import annotations

import argparse
import ctypes
import json
import os

NAMES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--telemetry-fd", type=int, default=None)
    args = parser.parse_args()
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    seen: dict[str, object] = {"pid": os.getpid()}
    for name in NAMES:
        raw = libc.getenv(name.encode())
        seen[name] = {"python": os.environ.get(name), "libc": raw.decode() if raw else None}
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(seen, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
