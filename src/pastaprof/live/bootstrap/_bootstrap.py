"""Started by ``pastaprof run``: this directory is put first on PYTHONPATH, so
Python imports its ``sitecustomize`` at start-up, before the program's own code, and that
runs this file as its own code (on Python 3.8 and later; older ones get nothing).

It must leave the program as it would be without pastaprof:

* start-up cost: only ``os`` and ``sys`` (already loaded) are used here.  The capture
  session (pyarrow, numpy, the handlers: 0.3-0.45 s) starts when the process first imports
  a GPU framework (``_TRIGGERS``) or pastaprof's own capture verbs (``pastaprof.live``), so a
  Python child that does neither pays only this module (bench/child_start.py);
* ``sys.path`` loses this directory before the program's code runs;
* ``os.environ`` is what the program was given: PYTHONPATH without this directory, and none
  of the variables ``pastaprof run`` added for itself (``PASTAPROF_HIDE_ENV`` names them).
  They stay in the process's C environment, which children inherit, and an environment the
  program hands to a child (``subprocess``'s ``env=``, ``os.execve``, ``os.posix_spawn``) gets
  them back wherever it carries the run's ``PASTAPROF_OUT`` (``_Environment``);
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


class _Environment:
    """os.environ without pastaprof's variables; the C environment and children's with them."""

    def __init__(self, added):
        self.added = {}  # name -> value in the C environment, for environments handed to children
        for name in added:
            if name and name != "PYTHONPATH" and name in os.environ:
                self.added[name] = os.environ[name]
                self._show(name, None)
        value = os.environ.get("PYTHONPATH")
        if value is not None:  # none of its own (pastaprof added it), or what the program set since
            value = self._without_us(value)
            self._show("PYTHONPATH", None if not value and "PYTHONPATH" in added else value)
        self.hide_env = ",".join(added)

    @staticmethod
    def _show(name, value):
        """What os.environ says for ``name``, leaving the C environment as it is."""
        data, key = os.environ._data, os.environ.encodekey(name)
        if value is None:
            data.pop(key, None)
        else:
            data[key] = os.environ.encodevalue(value)

    @staticmethod
    def _without_us(value):
        return value[len(_HERE) + 1:] if value.startswith(_HERE + os.pathsep) else ("" if value == _HERE else value)

    @staticmethod
    def with_us(value):
        value = os.fsdecode(value)
        return value if value.split(os.pathsep)[0] == _HERE else os.pathsep.join(p for p in (_HERE, value) if p)

    def for_child(self, env):
        """A child's environment (a mapping, or fork_exec's list of b"NAME=value") with
        pastaprof's variables, where it is one of this run's (it has PASTAPROF_OUT)."""
        if env is None:
            return env
        if isinstance(env, (list, tuple)):
            pairs = dict(os.fsencode(e).partition(b"=")[::2] for e in env)
            if b"PASTAPROF_OUT" not in pairs:
                return env
            pairs[b"PYTHONPATH"] = os.fsencode(self.with_us(pairs.get(b"PYTHONPATH", b"")))
            for name, value in self.added.items():
                pairs.setdefault(os.fsencode(name), os.fsencode(value))
            return [k + b"=" + v for k, v in pairs.items()]
        keys = {os.fsdecode(k): k for k in env}
        if "PASTAPROF_OUT" not in keys:
            return env
        env = dict(env)
        key = keys.get("PYTHONPATH", "PYTHONPATH")
        value = self.with_us(env.get(key, ""))
        env[key] = os.fsencode(value) if isinstance(key, bytes) else value
        for name, value in self.added.items():
            if name not in keys:
                env[name] = value
        return env

    def install(self):
        """Wrap where the program sets PYTHONPATH (os.environ's putenv/unsetenv: the C value
        keeps this directory first) and where it hands an environment to a child."""
        import _posixsubprocess

        real_putenv, real_unsetenv, real_fork_exec = os.putenv, os.unsetenv, _posixsubprocess.fork_exec
        real_execve, real_spawn, real_spawnp = os.execve, os.posix_spawn, os.posix_spawnp

        def putenv(name, value):
            name_ = os.fsdecode(name)
            if self.added.pop(name_, None) is not None:  # the program's own value from now on
                self.hide_env = ",".join(n for n in self.hide_env.split(",") if n != name_)
                real_putenv("PASTAPROF_HIDE_ENV", self.hide_env)
            real_putenv(name, self.with_us(value) if name_ == "PYTHONPATH" else value)

        def unsetenv(name):
            if os.fsdecode(name) == "PYTHONPATH":
                return real_putenv(name, _HERE)
            return real_unsetenv(name)

        def fork_exec(*args):
            args = list(args)
            args[5] = self.for_child(args[5])  # env_list (subprocess, multiprocessing)
            return real_fork_exec(*args)

        def execve(path, argv, env):
            return real_execve(path, argv, self.for_child(env))

        def posix_spawn(path, argv, env, **kwargs):
            return real_spawn(path, argv, self.for_child(env), **kwargs)

        def posix_spawnp(path, argv, env, **kwargs):
            return real_spawnp(path, argv, self.for_child(env), **kwargs)

        for wrapper, real in ((putenv, real_putenv), (unsetenv, real_unsetenv), (fork_exec, real_fork_exec),
                              (execve, real_execve), (posix_spawn, real_spawn), (posix_spawnp, real_spawnp)):
            for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
                try:
                    setattr(wrapper, attr, getattr(real, attr))
                except (AttributeError, TypeError):
                    pass
            mod = sys.modules.get(getattr(real, "__module__", None) or "")  # (posix): where pickle
            if mod is not None and getattr(mod, real.__name__, None) is real:  # looks it up by name
                setattr(mod, real.__name__, wrapper)
        os.putenv, os.unsetenv, os.execve, os.posix_spawn, os.posix_spawnp = (putenv, unsetenv, execve, posix_spawn,
                                                                              posix_spawnp)
        _posixsubprocess.fork_exec = fork_exec


def _hide_environment() -> None:
    try:
        env = _Environment(os.environ.get("PASTAPROF_HIDE_ENV", "").split(","))
        env.install()
    except Exception as e:  # never harm the profiled program
        sys.stderr.write(f"pastaprof: warning: the environment is shown as pastaprof set it: {type(e).__name__}: {e}\n")


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


if os.environ.get("PASTAPROF_OUT"):
    _hide_environment()
if os.environ.get("PASTAPROF_OUT") and not _launcher():
    sys.meta_path.insert(0, _StartOnImport())
    if os.environ.get("PASTAPROF_EAGER", "") not in ("", "0"):
        _start()
_hide()
# The program's own sitecustomize, or the absence of one, exactly as Python would see it.
if _shadowed() is None:
    raise ModuleNotFoundError("No module named 'sitecustomize'", name="sitecustomize")
