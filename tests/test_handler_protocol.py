"""The handler contract (handlers/base.py) and its registry (handlers/registry.py):
third-party handlers installed as real distributions (a dist-info with an entry point on
the path) are discovered, started by ``pastaprof run`` in the program's process, and their
events land in the run store; broken ones are refused by name and capture goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pastaprof
from pastaprof.errors import UsageError
from pastaprof.handlers import registry
from pastaprof.handlers.base import Gated, Handler, RangeAware, Setting, Summarized, boolean, integer

BUILTIN = {"sanitizer", "cupti", "uvm_plan", "torch", "native"}

PLUGIN = textwrap.dedent('''
    """A third party's handlers: one file, one entry-point line each."""
    import time

    import pyarrow as pa

    from pastaprof.handlers.base import Gated, Handler, RangeAware, Setting, Summarized, integer

    MODES = ("ok", "undeclared", "start_raises", "drain_raises")


    def _mode(value):
        if value not in MODES:
            raise ValueError(f"expected one of {', '.join(MODES)}")


    class Ticks(Handler, Summarized):
        """N counter rows, values i*i, from one drain as (kind, RecordBatch) pairs."""
        name = "ticks"
        kinds = ("counter",)
        settings = (Setting("TICKS", "counter rows to emit", integer(0, 1000000)),
                    Setting("TICKS_MODE", "how to misbehave", _mode))

        @classmethod
        def create(cls, ctx):
            h = cls()
            h.rank, h.n = ctx.rank, int(ctx.config.setting("TICKS", "5"))
            h.mode = ctx.config.setting("TICKS_MODE", "ok")
            return h

        def start(self):
            if self.mode == "start_raises":
                raise RuntimeError("no device for ticks")
            self.t0, self.left = time.time_ns(), self.n

        def drain(self):
            if self.mode == "drain_raises":
                raise OSError("ticks buffer gone")
            n, self.left = self.left, 0
            if not n:
                return []
            self.records += n
            batch = pa.record_batch({
                "start_ns": pa.array([self.t0 + i for i in range(n)], pa.int64()),
                "end_ns": pa.array([self.t0 + i + 1 for i in range(n)], pa.int64()),
                "rank": pa.array([self.rank] * n, pa.int32()),
                "name": pa.array(["tick"] * n), "value": pa.array([float(i * i) for i in range(n)])})
            out = [("counter", batch)]
            if self.mode == "undeclared":
                out.append(("kernel", batch))
            return out

        def summary(self):
            return {"emitted": self.records}


    class Marks(Handler, Gated, RangeAware):
        """One counter row per range entered; remembers the gate's transitions."""
        name = "marks"
        kinds = ("counter",)

        def __init__(self):
            self.rows, self.gates = [], []

        @classmethod
        def create(cls, ctx):
            h = cls()
            h.rank = ctx.rank
            return h

        def set_gate(self, open_):
            if not self.gates or self.gates[-1] != open_:
                self.gates.append(open_)

        def range_begin(self, name):
            self.rows.append((time.time_ns(), name))

        def drain(self):
            rows, self.rows = self.rows, []
            self.records += len(rows)
            if not rows:
                return {}
            return {"counter": pa.table({"start_ns": pa.array([t for t, _ in rows], pa.int64()),
                                         "end_ns": pa.array([t for t, _ in rows], pa.int64()),
                                         "rank": pa.array([self.rank] * len(rows), pa.int32()),
                                         "name": [n for _, n in rows], "value": [1.0] * len(rows)})}

        def stats(self):
            return {**super().stats(), "gates": self.gates}
''')

BROKEN = textwrap.dedent('''
    from pastaprof.handlers.base import Handler


    class BadKind(Handler):
        name = "badkind"
        kinds = ("nonsense",)

        def drain(self):
            return {}


    class NoDrain(Handler):
        name = "nodrain"
        kinds = ("counter",)


    class NotAHandler:
        name = "notahandler"
        kinds = ("counter",)
''')


def _dist(site: Path, dist: str, module: str, source: str, entries: dict[str, str]) -> Path:
    """A real installed distribution: the module and a dist-info with entry points."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(source)
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[pastaprof.handlers]\n" + "".join(f"{n} = {v}\n" for n, v in entries.items()))
    return site


@pytest.fixture(scope="module")
def good_site(tmp_path_factory) -> Path:
    return _dist(tmp_path_factory.mktemp("good-site"), "pp_handlers_demo", "pp_handlers_demo", PLUGIN,
                 {"ticks": "pp_handlers_demo:Ticks", "marks": "pp_handlers_demo:Marks"})


@pytest.fixture(scope="module")
def bad_site(tmp_path_factory) -> Path:
    return _dist(tmp_path_factory.mktemp("bad-site"), "pp_handlers_broken", "pp_handlers_broken", BROKEN,
                 {"badkind": "pp_handlers_broken:BadKind", "nodrain": "pp_handlers_broken:NoDrain",
                  "notahandler": "pp_handlers_broken:NotAHandler", "missing": "pp_no_such_module:Gone",
                  "misnamed": "pp_handlers_broken:BadKind"})


def _env(*sites: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PASTAPROF_", "_PASTAPROF_"))}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, sites), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def _run(tmp_path: Path, program: str, *args: str, sites: tuple[Path, ...], **extra: str):
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(out), *args, "--",
                        sys.executable, "-c", program], capture_output=True, text=True, timeout=240,
                       env=_env(*sites, **extra))
    return p, out


def _counters(out: Path) -> list[dict]:
    return pastaprof.load(out).table("counter").to_pylist()


def _process(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())["processes"][0]


# -- the registry ---------------------------------------------------------------------------

def test_registry_lists_the_builtin_handlers_in_start_order():
    found = registry.available(refresh=True)
    assert BUILTIN <= set(found)
    order = [n for n in found if n in BUILTIN]
    assert order == ["sanitizer", "cupti", "uvm_plan", "torch", "native"]  # the sanitizer before CUDA, torch on import
    assert found["torch"].starts_on_import == "torch"
    caps = {h["name"]: set(h["capabilities"]) for h in registry.describe()}
    assert caps["sanitizer"] == {"gated", "summarized"} and caps["cupti"] == {"gated"}
    assert caps["uvm_plan"] == {"range_aware", "summarized"}
    # settings each handler declares are what the settings table holds
    assert {k for k, (h, _) in registry.settings().items() if h == "sanitizer"} == {
        "SAN_PCS", "SAN_PAGES", "SAN_RAW_MB", "SAN_SHARDS", "HEATMAP_CTA", "SAN_UNPATCH"}


def test_cli_lists_handlers_with_their_kinds(good_site):
    p = subprocess.run([sys.executable, "-m", "pastaprof.cli", "handlers"], capture_output=True, text=True,
                       env=_env(good_site), timeout=120)
    assert p.returncode == 0, p.stderr
    names = [line.split()[0] for line in p.stdout.splitlines()]
    assert set(names) == set(registry.available(refresh=True)) | {"ticks", "marks"} >= BUILTIN
    ticks = next(line for line in p.stdout.splitlines() if line.startswith("ticks"))
    assert "kinds: counter" in ticks and "PASTAPROF_TICKS" in ticks and "summarized" in ticks
    assert p.stderr == ""


@pytest.mark.parametrize("cls, why", [
    (type("K", (Handler,), {"name": "k", "kinds": ("nonsense",), "drain": lambda s: {}}), "unknown event kind 'nonsense'"),
    (type("K", (Handler,), {"name": "k", "kinds": ("counter",)}), "does not implement drain()"),
    (type("K", (Handler,), {"name": "", "kinds": ("counter",), "drain": lambda s: {}}), "name ''"),
    (type("K", (Handler,), {"name": "Bad Name", "kinds": ("counter",), "drain": lambda s: {}}), "lower-case"),
    (type("K", (Handler,), {"name": "k", "kinds": (), "drain": lambda s: {}}), "kinds must be"),
    (type("K", (Handler,), {"name": "k", "kinds": ["counter"], "drain": lambda s: {}}), "kinds must be"),
    (type("K", (Handler,), {"name": "k", "kinds": ("counter",), "drain": lambda s: {}, "settings": ("X",)}),
     "settings must be"),
    (type("K", (), {"name": "k", "kinds": ("counter",)}), "not a pastaprof.handlers.base.Handler"),
    (42, "not a pastaprof.handlers.base.Handler"),
])
def test_validate_refuses_a_malformed_handler_by_name(cls, why):
    with pytest.raises(registry.HandlerError) as e:
        registry.validate(cls, "k")
    assert "'k'" in str(e.value) and why in str(e.value)


def test_validate_refuses_an_entry_point_named_unlike_its_handler():
    cls = type("K", (Handler,), {"name": "ticks", "kinds": ("counter",), "drain": lambda s: {}})
    with pytest.raises(registry.HandlerError, match="registered as 'tocks' but named 'ticks'"):
        registry.validate(cls, "tocks")
    assert registry.validate(cls, "ticks") is cls


def test_setting_checks():
    s = Setting("N", "n", integer(1, 64))
    s.validate("64")
    s.validate("")  # unset
    for bad, why in (("0", "must be 1 to 64"), ("x", "expected an integer"), ("65", "must be 1 to 64")):
        with pytest.raises(UsageError, match=f"PASTAPROF_N='{bad}': {why}"):
            s.validate(bad)
    b = Setting("B", "b", boolean)
    b.validate("off")
    with pytest.raises(UsageError, match="expected 0 or 1"):
        b.validate("maybe")


def test_broken_plugins_are_skipped_with_one_warning_each(good_site, bad_site):
    p = subprocess.run([sys.executable, "-m", "pastaprof.cli", "handlers"], capture_output=True, text=True,
                       env=_env(good_site, bad_site), timeout=120)
    assert p.returncode == 0, p.stderr
    assert {line.split()[0] for line in p.stdout.splitlines()} == set(registry.available(refresh=True)) | {"ticks", "marks"}
    warnings = p.stderr.splitlines()
    assert len(warnings) == 5, p.stderr
    assert all(w.startswith("pastaprof: warning: handler plugin ") for w in warnings)
    for name, why in (("badkind", "unknown event kind 'nonsense'"), ("nodrain", "does not implement drain()"),
                      ("notahandler", "is not a pastaprof.handlers.base.Handler"),
                      ("missing", "failed to load: ModuleNotFoundError"),
                      ("misnamed", "registered as 'misnamed' but named 'badkind'")):
        assert sum(f"'{name}'" in w and why in w for w in warnings) == 1, (name, p.stderr)


# -- third-party handlers under `pastaprof run` -------------------------------------------------

PROGRAM = "import pastaprof, sys; pastaprof.step(); print('program output'); sys.exit(3)"


def test_a_third_party_handler_lands_its_events_in_the_run(tmp_path, good_site):
    p, out = _run(tmp_path, PROGRAM, sites=(good_site,), PASTAPROF_TICKS="7")
    assert p.returncode == 3 and p.stdout == "program output\n", p.stderr  # the program is unharmed
    ticks = [r for r in _counters(out) if r["name"] == "tick"]
    assert len(ticks) == 7
    assert sorted(r["value"] for r in ticks) == [float(i * i) for i in range(7)]
    assert {r["rank"] for r in ticks} == {0} and all(r["pid"] for r in ticks)
    proc = _process(out)
    assert proc["handlers"]["ticks"]["records"] == 7
    assert proc["summaries"]["ticks"] == {"emitted": 7}
    assert proc["status"]["ticks"] == "ok"
    assert proc["events"]["counter"] == 7


def test_a_handler_setting_is_validated_before_the_program_starts(tmp_path, good_site):
    marker = tmp_path / "started"
    program = f"open({str(marker)!r}, 'w').close()"
    for var, value, why in (("PASTAPROF_TICKS", "many", "expected an integer"),
                            ("PASTAPROF_TICKS_MODE", "loud", "expected one of ok, undeclared, start_raises, drain_raises")):
        p, out = _run(tmp_path, program, sites=(good_site,), **{var: value})
        assert p.returncode == 2
        assert p.stderr.strip().splitlines() == [f"pastaprof: error: {var}={value!r}: {why}"]
        assert not marker.exists() and not out.exists()


def test_gated_and_range_aware_handlers_follow_the_capture_windows(tmp_path, good_site):
    program = textwrap.dedent("""
        import pastaprof
        for name in ("sel1", "other", "sel2", "other"):
            with pastaprof.range(name):
                pass
    """)
    p, out = _run(tmp_path, program, "--ranges", "sel*", sites=(good_site,))
    assert p.returncode == 0, p.stderr
    marks = [r["name"] for r in _counters(out) if r["name"] != "tick"]
    # one row per range entered, the store keeping those inside a selected range's window
    assert sorted(marks) == ["sel1", "sel2"]
    proc = _process(out)
    assert proc["handlers"]["marks"]["records"] == 4  # all four were drained, two gated by the store
    assert proc["filtered_by_kind"]["counter"] == 2 + 5  # the two 'other' rows and the 5 ticks (at start)
    # the gate at the source: closed at start, open in each selected range only
    assert proc["handlers"]["marks"]["gates"] == [False, True, False, True, False]


def test_a_handler_failing_at_start_is_one_warning_and_the_run_goes_on(tmp_path, good_site):
    p, out = _run(tmp_path, PROGRAM, sites=(good_site,), PASTAPROF_TICKS_MODE="start_raises")
    assert p.returncode == 3 and p.stdout == "program output\n"
    proc = _process(out)
    assert proc["status"]["ticks"] == "ticks handler not started: RuntimeError: no device for ticks"
    assert "ticks" not in proc["handlers"] and "marks" in proc["handlers"]
    assert p.stderr.count("ticks handler not started") == 1
    assert pastaprof.load(out).table("counter").num_rows == 0


def test_a_handler_failing_to_drain_loses_only_its_own_events(tmp_path, good_site):
    program = "import pastaprof\nwith pastaprof.range('r'):\n    pass\n"
    p, out = _run(tmp_path, program, sites=(good_site,), PASTAPROF_TICKS_MODE="drain_raises")
    assert p.returncode == 0, p.stderr
    proc = _process(out)
    assert "ticks" in proc["status"]["drain failed"]
    assert [r["name"] for r in _counters(out)] == ["r"]  # marks' row survived ticks' failure
    assert len(pastaprof.load(out).table("range")) == 1


def test_undeclared_kinds_are_dropped_with_one_warning(tmp_path, good_site):
    p, out = _run(tmp_path, PROGRAM, sites=(good_site,), PASTAPROF_TICKS="3", PASTAPROF_TICKS_MODE="undeclared")
    assert p.returncode == 3
    assert len([r for r in _counters(out) if r["name"] == "tick"]) == 3
    assert pastaprof.load(out).table("kernel").num_rows == 0
    assert "ticks handler emitted 'kernel' events, not among its kinds (counter): dropped" in p.stderr


@pytest.mark.parametrize("ticks", ["2", ""])
def test_broken_plugins_do_not_stop_a_run(tmp_path, good_site, bad_site, ticks):
    """Each broken plugin is warned about once: with a handler setting set, by the launcher
    (which checks it, then hands the list on), else by the program's process."""
    p, out = _run(tmp_path, PROGRAM, sites=(good_site, bad_site), PASTAPROF_TICKS=ticks)
    assert p.returncode == 3 and p.stdout == "program output\n"
    assert len([r for r in _counters(out) if r["name"] == "tick"]) == int(ticks or 5)
    for name in ("badkind", "nodrain", "notahandler", "missing", "misnamed"):
        assert p.stderr.count(f"handler plugin '{name}'") == 1, p.stderr


def test_the_launcher_loads_handlers_only_to_check_their_settings():
    """`pastaprof run` checks settings before the program starts; the handlers' modules (pyarrow,
    numpy: ~0.3 s) load for that only where a handler setting is set."""
    code = ("import sys; from pastaprof.live.config import CaptureConfig; from pastaprof.handlers import registry; "
            "c = CaptureConfig.from_env(dict(a.split('=') for a in sys.argv[1:])); "
            "print('pyarrow' in sys.modules, registry.loaded(), c.setting('SAN_PCS'))")

    def probe(*env: str) -> str:
        return subprocess.run([sys.executable, "-c", code, *env], capture_output=True, text=True, check=True,
                              env=_env(), timeout=120).stdout.split()

    assert probe("PASTAPROF_RANGES=a*", "PASTAPROF_STEPS=2:4") == ["False", "False", "None"]
    assert probe("PASTAPROF_SAN_PCS=4") == ["True", "True", "4"]
    p = subprocess.run([sys.executable, "-c", code, "PASTAPROF_SAN_PCS=-4"], capture_output=True, text=True,
                       env=_env(), timeout=120)
    assert p.returncode == 1 and "UsageError: PASTAPROF_SAN_PCS='-4': must be 0 or more" in p.stderr


def test_the_api_takes_handler_settings_as_keywords(tmp_path, good_site):
    program = textwrap.dedent(f"""
        import json, pastaprof
        with pastaprof.profile(out={str(tmp_path / 'api')!r}, ticks=4) as prof:
            pass
        t = prof.run.table("counter").to_pylist()
        print(json.dumps(sorted(r["value"] for r in t if r["name"] == "tick")))
        try:
            pastaprof.start(tickz=1)
        except pastaprof.UsageError as e:
            print(e)
    """)
    p = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=240,
                       env=_env(good_site))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert json.loads(lines[0]) == [0.0, 1.0, 4.0, 9.0]
    assert lines[1].startswith("unknown capture setting 'tickz' (known: ") and "ticks" in lines[1]


# -- the protocol in-process ---------------------------------------------------------------------

def test_capability_mixins_are_what_the_session_tests():
    from pastaprof.handlers.cupti_activity import CuptiActivityHandler
    from pastaprof.handlers.sanitizer import SanitizerHandler
    from pastaprof.handlers.torch_ops import TorchHandler
    from pastaprof.live.uvm_plan import UvmPlanApplier

    assert issubclass(SanitizerHandler, Gated) and SanitizerHandler.gate_is_instrumentation
    assert issubclass(TorchHandler, Gated) and TorchHandler.gated_once_armed
    assert issubclass(CuptiActivityHandler, Gated) and not issubclass(CuptiActivityHandler, RangeAware)
    assert issubclass(UvmPlanApplier, RangeAware) and issubclass(UvmPlanApplier, Summarized)
    for cls in (SanitizerHandler, TorchHandler, CuptiActivityHandler, UvmPlanApplier):
        assert registry.validate(cls, cls.name) is cls


def test_a_misbehaving_handler_costs_only_its_own_events(tmp_path, capfd):
    """Hostile handlers in one session beside a good one: wrong table types, a missing required
    column, columns that do not cast, and stop/stats/summary/before_drain raising.  The good
    handler's events are all stored, the manifest is written, each trouble is one warning."""
    import pyarrow as pa

    from pastaprof.live.config import CaptureConfig
    from pastaprof.live.session import Session
    from pastaprof.store.compact import compact

    def counters(n, t0=1000, name="good", **over):
        cols = {"start_ns": pa.array([t0 + i for i in range(n)], pa.int64()),
                "end_ns": pa.array([t0 + i for i in range(n)], pa.int64()),
                "rank": pa.array([0] * n, pa.int32()), "name": [name] * n, "value": [1.0] * n}
        cols.update(over)
        return pa.table(cols)

    class Good(Handler):
        name, kinds = "good", ("counter",)

        def __init__(self):
            self.flushes = 0

        def drain(self):
            self.flushes += 1
            return {"counter": counters(3, t0=1000 * self.flushes)}

    class Dicts(Handler):
        name, kinds = "dicts", ("counter",)

        def drain(self):
            return {"counter": [{"start_ns": 1}]}

    class NoRank(Handler):
        name, kinds = "norank", ("counter",)

        def drain(self):
            return {"counter": counters(2).drop_columns(["rank"])}

    class Uncastable(Handler):
        name, kinds = "uncastable", ("range",)

        def drain(self):
            return {"range": pa.table({"start_ns": ["soon"], "end_ns": ["later"], "rank": pa.array([0], pa.int32()),
                                       "name": ["x"]})}

    class Raising(Handler, Summarized):
        name, kinds = "raising", ("counter",)

        def before_drain(self, final):
            raise RuntimeError("before")

        def drain(self):
            return {"counter": counters(1, t0=5, name="raising")}

        def stop(self):
            raise RuntimeError("stop")

        def stats(self):
            raise RuntimeError("stats")

        def summary(self):
            raise RuntimeError("summary")

    out = tmp_path / "run"
    s = Session(CaptureConfig(out=str(out), flush_ms=100000), gpu=False).start()
    # the hostile ones first: a good handler after them in the list loses nothing
    s.handlers += [Dicts(), NoRank(), Uncastable(), Raising(), good := Good()]
    s.flush()
    s.stop()
    compact(out)
    names = [r["name"] for r in pastaprof.load(out).table("counter").to_pylist()]
    assert names.count("good") == 3 * good.flushes == 6  # one periodic flush, the final one
    assert names.count("raising") == 2  # its drain still ran after before_drain raised
    assert len(names) == 8
    proc = _process(out)
    assert set(proc["status"]["drain failed"].split()) == {"dicts", "norank", "range", "raising"}
    assert proc["handlers"]["raising"]["error"] == "stats(): RuntimeError: stats"
    assert proc["handlers"]["good"]["records"] == 0  # it keeps no count: the default row
    assert proc["summaries"]["raising"] == {"error": "RuntimeError: summary"}
    err = capfd.readouterr().err
    assert err.count("dicts events of a flush lost: TypeError: counter events as a list") == 1
    assert err.count("norank events of a flush lost: ValueError: counter events without the column(s) rank") == 1
    assert err.count("range events of a flush lost (conform)") == 1
    assert err.count("raising events of a flush lost (before_drain): RuntimeError: before") == 1
    assert err.count("raising handler did not stop cleanly: RuntimeError: stop") == 1


def test_fuzzed_handler_lists_from_the_launcher_never_break_discovery(monkeypatch):
    """PASTAPROF_FOUND_HANDLERS (the launcher's list) fuzzed with a fixed seed: discovery never raises;
    a list that is not the launcher's shape is ignored (the installed handlers are scanned);
    each entry that does not load is left out."""
    import random

    rng = random.Random(1234)
    atoms = ["", "[", "]", "{", "}", '"', ",", ":", "null", "1", "[[]]", '["a"]', '[["cupti"]]', "\x01", "é",
             '["torch", "pastaprof.handlers.torch_ops:TorchHandler"]', '"os:system"', '"pastaprof:__version__"',
             '"pastaprof.handlers.base:Handler"', '"no.such.module:X"', '"pastaprof.handlers.cupti_activity:"']
    warnings: list[str] = []
    monkeypatch.setattr(registry, "_warn", warnings.append)
    try:
        for _ in range(300):
            text = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 12)))
            if rng.random() < 0.3:
                text = "[" + ",".join(f"[{rng.choice(atoms)},{rng.choice(atoms)}]" for _ in range(rng.randint(0, 3))) + "]"
            monkeypatch.setenv(registry.FOUND_ENV, text)
            warnings.clear()
            found = registry.available(refresh=True)
            try:
                shaped = json.loads(text)
            except ValueError:
                shaped = None
            ok_shape = isinstance(shaped, list) and all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in shaped)
            if not ok_shape:
                assert BUILTIN <= set(found), text  # scanned instead
                assert not warnings
            else:  # the launcher's shape: exactly its entries, each one loaded or warned about
                names = {n for n, _ in shaped}
                assert set(found) <= names
                warned = {n for n in names if any(f"handler plugin {n!r}" in w for w in warnings)}
                assert warned | set(found) == names, (text, warnings)
                assert len(warnings) <= len(shaped)
            assert all(isinstance(c, type) and issubclass(c, Handler) for c in found.values())
    finally:
        monkeypatch.delenv(registry.FOUND_ENV)
        registry.forget()


def test_pastaprofs_own_imports_of_the_live_package_do_not_start_capture(tmp_path):
    """Under `pastaprof run` the program's import of pastaprof.live (its verbs) starts capture;
    pastaprof's own modules importing the live package (handlers, pastaprof.analyze) do not --
    capture then starts at the program's first range or step."""
    program = textwrap.dedent("""
        import sys
        from pastaprof.handlers import registry
        registry.available()  # the handlers' modules import pastaprof.live.config
        print(sys.modules["pastaprof.live"].current() is None)
        if sys.argv[1:] == ["verbs"]:
            import pastaprof
            with pastaprof.range("after"):
                pass
            pastaprof.step()
            print(sys.modules["pastaprof.live"].current() is None)
    """)
    script = tmp_path / "app.py"
    script.write_text(program)
    for args, stdout, processes in (([], "True\n", 0), (["verbs"], "True\nFalse\n", 1)):
        out = tmp_path / f"run{len(args)}"
        p = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(out), "--", sys.executable,
                            str(script), *args], capture_output=True, text=True, timeout=240, env=_env())
        assert p.returncode == 0 and p.stdout == stdout, p.stderr
        assert len(json.loads((out / "run.json").read_text())["processes"]) == processes
        if processes:
            assert [r["name"] for r in pastaprof.load(out).table("range").to_pylist()] == ["after"]
