# Started by `pastaprof run` in every Python process of the program (this directory is first on
# PYTHONPATH); the bootstrap itself is _bootstrap.py, run here as this module's own code.  This
# file must parse and run on any Python a program may start, 2.7 included: an interpreter the
# bootstrap does not support gets nothing of pastaprof, as if this directory were not there.
import os
import sys

if sys.version_info >= (3, 8):  # noqa: UP036 -- the program's children may run any Python
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap.py"), "rb") as _f:
        exec(compile(_f.read(), _f.name, "exec"))
else:
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    _absent = ImportError("No module named 'sitecustomize'")
    _absent.name = "sitecustomize"  # site says nothing of a sitecustomize that is not there
    raise _absent
