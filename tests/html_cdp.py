"""A tiny Chrome DevTools Protocol client over ``--remote-debugging-pipe`` (no websocket, no
playwright): open a page in real headless Chromium, record every network request, console
message and uncaught exception, evaluate JavaScript in the page, take a screenshot.

Chromium reads commands (JSON, each ended by a NUL byte) on its fd 3 and writes replies and
events on its fd 4.  Used by tests/test_html_report.py and bench/html_report.py.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """One headless Chromium with one page (target) attached in flat session mode."""

    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        exe = chromium()
        if exe is None:
            raise RuntimeError("no chromium")
        self._profile = tempfile.mkdtemp(prefix="pp-cdp-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # the child must see the pipe ends as fds 3 and 4: dup them there in the child
        def child() -> None:  # dup2 clears close-on-exec; fds of this process stay closed on exec
            a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)  # above 4: dup2 cannot clobber them
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--metrics-recording-only", "--mute-audio",
             f"--user-data-dir={self._profile}", f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=child, close_fds=False)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=True)

    # --- transport -------------------------------------------------------------------------
    def _send(self, msg: dict[str, Any]) -> None:
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")

    def _read(self, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if ready:
                chunk = os.read(self._from_chrome, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the pipe")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict[str, Any] | None = None, session: bool = False,
             timeout: float = 60.0) -> dict[str, Any]:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        self._send(msg)
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(max(0.0, deadline - time.monotonic()))
            if reply is None:
                raise TimeoutError(method)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 60.0) -> dict[str, Any]:
        for e in self.events:
            if e["method"] == method:
                return e
        deadline = time.monotonic() + timeout
        while True:
            e = self._read(max(0.0, deadline - time.monotonic()))
            if e is None:
                raise TimeoutError(method)
            if "method" in e:
                self.events.append(e)
                if e["method"] == method:
                    return e

    # --- page ------------------------------------------------------------------------------
    def open(self, path: Path, ready: str = "window.ppReady === true", timeout: float = 60.0) -> float:
        """Load ``path``; return seconds until ``ready`` is true in the page."""
        self.events.clear()
        t0 = time.monotonic()
        self.call("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=True)
        self.wait_event("Page.loadEventFired", timeout)
        while not self.eval(ready):
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(ready)
            time.sleep(0.05)
        return time.monotonic() - t0

    def eval(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
                      session=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"page script failed: {r['exceptionDetails']}")
        return r["result"].get("value")

    def screenshot(self, dest: Path, full: bool = False) -> None:
        params: dict[str, Any] = {"format": "png"}
        if full:
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", params, session=True)["data"]
        Path(dest).write_bytes(base64.b64decode(data))

    def drain(self, seconds: float = 0.3) -> None:
        """Collect the events that arrive within ``seconds`` (console output after load)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            e = self._read(max(0.0, end - time.monotonic()))
            if e is not None and "method" in e:
                self.events.append(e)

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"]

    def errors(self) -> list[str]:
        """Uncaught exceptions, console.error/warn calls and error log entries."""
        out = []
        for e in self.events:
            m, p = e["method"], e.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append(json.dumps(p.get("exceptionDetails", {}))[:500])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(p["entry"].get("text", ""))
        return out

    def close(self) -> None:
        try:
            self._send({"id": 10**9, "method": "Browser.close"})
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
