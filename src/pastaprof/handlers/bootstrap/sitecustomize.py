"""Started by ``pastaprof run``: this directory is put first on PYTHONPATH, so
Python imports this module at start-up, before the program's own code.

It starts a capture session from the PASTAPROF_* environment (which every
child process inherits), then runs the sitecustomize this one shadows, if any.
Nothing here may break the program: any failure is one warning on stderr.
"""

import os
import sys


def _launcher() -> bool:
    """torchrun's (torch.distributed.run's) own agent process: it only starts the ranks,
    which capture themselves; captured, it would pose as a rank 0 without GPU work."""
    if os.environ.get("LOCAL_RANK") is not None:
        return False
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if any(os.path.basename(a) == "torchrun" for a in argv[:2]):  # the console script
        return True
    return "-m" in argv and argv[argv.index("-m") + 1:][:1] in (["torch.distributed.run"], ["torch.distributed.launch"])


def _start() -> None:
    if not os.environ.get("PASTAPROF_OUT") or _launcher():
        return
    try:
        import pastaprof.live

        pastaprof.live.start()
    except Exception as e:  # never harm the profiled program
        sys.stderr.write(f"pastaprof: warning: capture not started: {type(e).__name__}: {e}\n")


def _chain() -> None:
    """Run the next sitecustomize on sys.path (the one ours shadows)."""
    here = os.path.dirname(os.path.abspath(__file__))
    import importlib.machinery
    import importlib.util

    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as e:
        sys.stderr.write(f"pastaprof: warning: the program's sitecustomize failed: {e}\n")


_start()
_chain()
