"""gpuwatch's hook, first on a watched command's PYTHONPATH (`gpuwatch run -- ...`).

Python imports this at start-up, before the script. It must never break the
script: whatever fails here, the script runs on unwatched (and the dashboard says
why). It takes its directory off sys.path and PYTHONPATH (a grandchild Python is
not instrumented twice), runs the sitecustomize that would have run without it,
then hands over to trainer_runtime.hook.watch, which waits for TensorFlow.
"""

import os
import sys


def _gpuwatch_hook_start() -> None:
    here = os.path.dirname(os.path.abspath(__file__))

    def _same(entry: str) -> bool:
        try:
            return os.path.abspath(entry or ".") == here
        except (TypeError, ValueError):
            return False

    sys.path[:] = [p for p in sys.path if not _same(p)]
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and not _same(p)]
    if parts:
        os.environ["PYTHONPATH"] = os.pathsep.join(parts)
    else:
        os.environ.pop("PYTHONPATH", None)
    fd = os.environ.pop("GPUWATCH_HOOK_FD", None)
    settings = os.environ.pop("GPUWATCH_HOOK", None)

    # The sitecustomize that would have run without us (a distribution's, a venv's, the
    # person's own): only one is ever imported, so this one imports the next.
    ours = sys.modules.pop("sitecustomize", None)
    chained_error: BaseException | None = None
    try:
        import sitecustomize  # noqa: F401  (the next one on the path, if any)
    except ImportError as exc:
        if exc.name != "sitecustomize":
            chained_error = exc
    except Exception as exc:  # theirs failed: as Python would, say so and go on
        chained_error = exc
    if "sitecustomize" not in sys.modules and ours is not None:
        sys.modules["sitecustomize"] = ours
    if chained_error is not None:
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
              f"{type(chained_error).__name__}: {chained_error}", file=sys.stderr)

    if fd is None:
        return
    # Our own package, from where this file lies, if the command's Python cannot import it.
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    added = False
    try:
        try:
            from trainer_runtime.hook import watch
        except ImportError:
            sys.path.insert(0, root)
            added = True
            from trainer_runtime.hook import watch
    except BaseException as exc:
        _unwatched(fd, settings, f"the hook could not load: {type(exc).__name__}: {exc}")
        return
    finally:
        if added and root in sys.path:
            sys.path.remove(root)
    watch.start(fd, settings)


def _unwatched(fd: str, settings: str | None, message: str) -> None:
    """Tell the supervisor in one raw frame (protocol version 1: the protocol module may be
    what failed to load) that the hook is off, and close the socket."""
    import json
    import socket

    try:
        sock = socket.socket(fileno=int(fd))
        attempt = json.loads(settings or "{}").get("attempt", 1)
        frame = {"v": 1, "type": "hook", "attempt": attempt, "installed": False,
                 "message": " ".join(message.split())[:300]}
        sock.sendall((json.dumps(frame) + "\n").encode())
        sock.close()
    except Exception:
        pass


try:
    _gpuwatch_hook_start()
except BaseException as _exc:
    print(f"gpuwatch: the hook is off: {type(_exc).__name__}: {_exc}", file=sys.stderr)
