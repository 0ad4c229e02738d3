"""What a program can see of its own process, one labelled line per aspect, after torch has
started the capture session and ran ops; bare and under ``pastaprof run`` each line must be
the same (tests/test_unharmed_process_state.py)."""

import os
import subprocess
import sys
import threading
import time

import torch


def show(label, *values):
    print(f"{label}:", *values, flush=True)


torch.manual_seed(0)
with torch.no_grad():
    torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())(torch.ones(2, 4)).sum()

show("path", sys.path[1:])
show("modules", sorted(m for m in sys.modules if m.split(".")[0] in {"setuptools", "distutils", "pkg_resources"}
                        or m == "torch.utils.cpp_extension"))
show("env", sorted(k for k in os.environ if not k.startswith("PASTAPROF_")))
show("pythonpath", os.environ.get("PYTHONPATH"), os.getenv("PYTHONPATH"))
env = {k: v for k, v in os.environ.items() if not k.startswith("PASTAPROF_")}
show("env copy", sorted(env) == sorted(k for k in dict(os.environ) if not k.startswith("PASTAPROF_")))
time.sleep(float(os.environ.get("OBSERVE_SLEEP", "1.2")))  # the capture's periodic flush has run
show("threads", threading.active_count(), sorted(t.name for t in threading.enumerate()))
# a child started with a copy of the environment, and one with the program's own PYTHONPATH
code = "import os, sys, torch; torch.ones(1).add(1); print(os.environ.get('PYTHONPATH'), sys.path[1:2])"
child = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True)
show("child", child.stdout.strip())
os.environ["PYTHONPATH"] = os.path.dirname(os.path.abspath(__file__))
child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
show("child own path", child.stdout.strip().replace(os.environ["PYTHONPATH"], "<dir>"))
