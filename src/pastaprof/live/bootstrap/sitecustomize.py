"""Started by ``pastaprof run``: this directory is put first on PYTHONPATH, so
Python imports this module at start-up, before the program's own code.

It must leave the program as it would be without pastaprof:

* start-up cost: only ``os`` and ``sys`` (already loaded) are used here.  The capture
  session (pyarrow, numpy, the handlers: 0.3-0.45 s) starts when the process first imports
  a GPU framework (``_TRIGGERS``) or pastaprof's own capture verbs (``pastaprof.live``), so a
  Python child that does neither pays only this module (bench/child_start.py);
* ``sys.path`` loses this directory before the program's code runs;
* the sitecustomize this one shadows runs as Python would run it: as the module
  ``sitecustomize``, its exception propagating to ``site`` (which prints its one-line error
  and goes on, or dies of a SystemExit), and ``sys.modules["sitecustomize"]`` is then what it
  is without pastaprof (the program's module, or none).

A failure of pastaprof's own is one warning on stderr.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# top-level modules whose import starts the capture session (right before they load: CUPTI
# and the sanitizer must be set up before anything initializes CUDA)
_TRIGGERS = frozenset(("torch", "cupy", "cupyx", "jax", "jaxlib", "tensorflow", "numba", "pycuda", "triton",
                       "cuda", "cupti", "tensorrt", "paddle", "mxnet", "cudf", "rmm", "warp"))
_VERBS = "pastaprof.live"


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
    try:
        import pastaprof.live  # noqa: F401 (may be running now: see _StartOnImport)

        sys.modules["pastaprof.live"].start()
    except Exception as e:  # never harm the profiled program
        sys.stderr.write(f"pastaprof: warning: capture not started: {type(e).__name__}: {e}\n")


def _from_pastaprof():
    """Whether the import of ``pastaprof.live`` comes from one of pastaprof's own modules (the
    live package holds the launcher and the capture pipeline besides the verbs) rather than
    from the program, directly or through ``pastaprof.range`` and the other lazy verbs."""
    f = sys._getframe(2)
    while f is not None and (f.f_code.co_filename.startswith("<frozen") or
                             f.f_globals.get("__name__") in ("importlib", "importlib._bootstrap")):
        f = f.f_back
    name = f.f_globals.get("__name__", "") if f is not None else ""
    return name.startswith("pastaprof.")


def _find(fullname, path, target):
    """The spec the rest of ``sys.meta_path`` gives (what the import would have found)."""
    for finder in list(sys.meta_path):
        find = getattr(finder, "find_spec", None)
        if find is not None:
            spec = find(fullname, path, target)
            if spec is not None:
                return spec
    return None


class _StartOnImport:
    """A meta-path finder that finds nothing itself: at the first import of a trigger it
    removes itself, starts the session, and answers with the spec the other finders give
    (the session's own import hooks, for torch, among them)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _TRIGGERS and fullname != _VERBS:
            return None
        internal = fullname == _VERBS and _from_pastaprof()
        try:
            sys.meta_path.remove(self)
        except ValueError:
            return None
        if fullname != _VERBS:
            _start()
            return _find(fullname, path, target)
        # the program's ``import pastaprof.live`` (pastaprof.range, .step, .profile): the
        # session starts once that module has run, in the module the program gets
        spec = _find(fullname, path, target)
        loader = getattr(spec, "loader", None)
        real_exec = getattr(loader, "exec_module", None)
        if real_exec is None:
            return spec

        def exec_module(module):
            try:
                del loader.exec_module  # the loader's own method again
            except AttributeError:
                pass
            real_exec(module)
            if internal:  # pastaprof's own modules (pastaprof.analyze's, say): capture starts at the
                finder = _StartOnImport()  # program's first verb, or at a framework's import
                module._start_on_first_use = finder  # (which the verb then removes)
                sys.meta_path.insert(0, finder)
            else:
                _start()

        loader.exec_module = exec_module
        return spec


def _hide() -> None:
    """This directory off ``sys.path`` (it stays in PYTHONPATH: child processes need it)."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    for key in [k for k in sys.path_importer_cache if os.path.abspath(k or ".") == _HERE]:
        del sys.path_importer_cache[key]


def _shadowed():
    """Run the sitecustomize this one shadows (the next one on sys.path), as the module
    ``sitecustomize``; its exception propagates.  Returns it, or None where there is none."""
    import _frozen_importlib as bootstrap

    spec = None
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is not None and not isinstance(finder, _StartOnImport):
            spec = find("sitecustomize", None)
            if spec is not None:
                break
    if spec is None or spec.loader is None:
        return None
    module = bootstrap.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)
    return module


if os.environ.get("PASTAPROF_OUT") and not _launcher():
    sys.meta_path.insert(0, _StartOnImport())
    if os.environ.get("PASTAPROF_EAGER", "") not in ("", "0"):
        _start()
_hide()
# The program's own sitecustomize, or the absence of one, exactly as Python would see it.
if _shadowed() is None:
    raise ModuleNotFoundError("No module named 'sitecustomize'", name="sitecustomize")
