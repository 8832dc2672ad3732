"""Open a page in headless Chromium and report what a reader would see: a screenshot, the
console's errors, images that failed to load, the rendered DOM.

The browser is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
JSON messages ending in a NUL byte, commands on the browser's fd 3, replies on its fd 4),
so no port is opened and nothing beyond the standard library is needed. Errors are
everything the console would show in red: ``console.error`` calls, uncaught exceptions,
and the browser's own entries of level ``error`` (a resource that failed to load, a
violated content security policy). The tests of the run report and the script that
draws the docs' pictures use it.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

#: names of a Chromium-family browser, tried in order on PATH
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-default-apps", "--hide-scrollbars", "--remote-debugging-pipe")

TRAMPOLINE = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
              "os.execv(sys.argv[3], sys.argv[3:])")

#: what the page is asked once it has loaded: how many images it has and how many failed
IMAGE_CHECK = ("JSON.stringify({images: document.images.length, broken: Array.from("
               "document.images).filter(i => !(i.complete && i.naturalWidth > 0)).length})")


def find_browser() -> Optional[str]:
    """The first Chromium-family browser on PATH, or None."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageRender:
    """What a headless browser made of a page."""

    screenshot: bytes
    """PNG of the whole page (its full height) at the requested width"""
    console_errors: list[str] = field(default_factory=list)
    images: int = 0
    broken_images: int = 0
    """``<img>`` elements that did not decode (a bad data URI, a blocked or missing file)"""
    dom: str = ""
    """``document.documentElement.outerHTML`` after loading"""


class _Pipe:
    """The DevTools protocol over the browser's pipe: commands and the events they cause."""

    def __init__(self, process: subprocess.Popen, to_browser: int, from_browser: int,
                 deadline: float):
        self.process, self.to_browser, self.from_browser = process, to_browser, from_browser
        self.deadline, self.buffer, self.next_id = deadline, b"", 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: Optional[dict] = None, session: Optional[str] = None
             ) -> dict[str, Any]:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self.receive()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"browser: {method} failed: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str) -> None:
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self.receive())

    def receive(self) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            left = self.deadline - time.monotonic()
            if left <= 0 or self.process.poll() is not None:
                raise TimeoutError("browser: no answer (timed out, or the browser exited)")
            ready, _, _ = select.select([self.from_browser], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self.from_browser, 1 << 20)
                if not chunk:
                    raise TimeoutError("browser: the pipe closed")
                self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)


def render_page(path: str | os.PathLike, *, width: int = 1280, height: int = 900,
                timeout: float = 90.0, browser: Optional[str] = None) -> PageRender:
    """Load the local file ``path`` in a fresh headless browser profile, wait for its load
    event, and return the screenshot, console errors, image counts and DOM."""
    browser = browser or find_browser()
    if browser is None:
        raise FileNotFoundError(f"render_page: no Chromium-family browser on PATH "
                                f"(tried {', '.join(BROWSERS)}; apt-get install chromium)")
    url = Path(path).resolve().as_uri()
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()
    # The browser's ends above 4, so that moving them to 3 and 4 overwrites neither.
    to_browser_r, from_browser_w = _high(to_browser_r), _high(from_browser_w)
    with tempfile.TemporaryDirectory(prefix="lightning_adv_browser_") as profile:
        # A Python trampoline moves the pipe ends to the protocol's fds 3 (commands in) and
        # 4 (replies out), then becomes the browser (a shell's redirections take one-digit
        # fds only, in dash).
        process = subprocess.Popen(
            [sys.executable, "-c", TRAMPOLINE, str(to_browser_r), str(from_browser_w), browser,
             *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(to_browser_r, from_browser_w))
        os.close(to_browser_r)
        os.close(from_browser_w)
        pipe = _Pipe(process, to_browser_w, from_browser_r, time.monotonic() + timeout)
        try:
            return _load(pipe, url, width, height)
        finally:
            try:
                pipe.send("Browser.close")
            except (OSError, RuntimeError, TimeoutError):
                pass
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            os.close(to_browser_w)
            os.close(from_browser_r)


def _high(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5)
    os.close(fd)
    return moved


def _load(pipe: _Pipe, url: str, width: int, height: int) -> PageRender:
    target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Page", "Runtime", "Log"):
        pipe.send(f"{domain}.enable", session=session)
    pipe.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                     "deviceScaleFactor": 1, "mobile": False},
              session=session)
    pipe.events.clear()
    pipe.send("Page.navigate", {"url": url}, session=session)
    pipe.wait_for("Page.loadEventFired")
    counts = json.loads(pipe.send("Runtime.evaluate", {"expression": IMAGE_CHECK},
                                  session=session)["result"]["value"])
    dom = pipe.send("Runtime.evaluate", {"expression": "document.documentElement.outerHTML"},
                    session=session)["result"]["value"]
    size = pipe.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": width, "height": max(height, int(size["height"])),
            "scale": 1}
    shot = pipe.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                "clip": clip}, session=session)
    return PageRender(screenshot=base64.b64decode(shot["data"]),
                      console_errors=_errors(pipe.events), images=counts["images"],
                      broken_images=counts["broken"], dom=dom)


def _errors(events: list[dict[str, Any]]) -> list[str]:
    errors = []
    for event in events:
        params = event.get("params", {})
        if event.get("method") == "Runtime.consoleAPICalled" and params.get("type") in (
                "error", "assert"):
            errors.append(" ".join(str(a.get("value", a.get("description", "")))
                                   for a in params.get("args", [])))
        elif event.get("method") == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            errors.append(details.get("exception", {}).get("description") or details.get("text", ""))
        elif event.get("method") == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            errors.append(params["entry"].get("text", ""))
    return errors
