"""The operator page in a real headless Chromium (Debian's package; .ci/run installs it), driven
over the DevTools protocol: it signs in through the page's own form, keeps the session cookie out
of the page's scripts (HttpOnly), loads nothing from anywhere but slotgate, and renders the data:
the policy's name and figures in the DOM, and the confidence sequences' bars in the screenshot.
Its clear button asks first, then clears."""

from __future__ import annotations

import base64
import io
import itertools
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from websockets.sync.client import ClientConnection, connect

from router.http.state import app_state
from tests.router.http.operator.conftest import ADMIN_KEY, decide, serve

BAND = (0x1F, 0x6F, 0xEB)  # the intervals' fill (--band in templates/base.html)
TARGET = (0xD1, 0x24, 0x2F)  # the target's mark and the clear button (--target, --bad)


class DevTools:
    """One page target over the DevTools protocol: commands answered in order, events kept."""

    def __init__(self, socket: ClientConnection) -> None:
        self.socket = socket
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        number = next(self.ids)
        self.socket.send(json.dumps({"id": number, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=20))
            if message.get("id") == number:
                assert "error" not in message, message
                result: dict[str, Any] = message["result"]
                return result
            self.events.append(message)

    def wait_for(self, event: str, *, after: int) -> dict[str, Any]:
        """The first ``event`` among the events from index ``after`` on, waited for."""
        for seen in self.events[after:]:
            if seen.get("method") == event:
                return seen
        while True:
            message = json.loads(self.socket.recv(timeout=20))
            self.events.append(message)
            if message.get("method") == event:
                return message

    def evaluate(self, expression: str) -> Any:
        return self.send("Runtime.evaluate", expression=expression,
                         returnByValue=True)["result"].get("value")


@contextmanager
def chromium(profile: Path) -> Iterator[DevTools]:
    """Headless Chromium on a blank page, with no network of its own (no updates, no sync)."""
    binary = shutil.which("chromium")
    # .ci/run installs chromium when the machine lacks it: a skip here would hide a broken page.
    assert binary is not None, "chromium is not installed (.ci/run installs it)"
    browser = subprocess.Popen(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-extensions", "--disable-sync",
         "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1200,1400",
         "about:blank"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        assert browser.stderr is not None
        address = None
        for line in browser.stderr:  # "DevTools listening on ws://127.0.0.1:PORT/devtools/..."
            found = re.search(r"DevTools listening on (ws://\S+)", line)
            if found:
                address = found.group(1)
                break
        assert address is not None, "chromium exited before it listened"
        port = re.search(r":(\d+)/", address)
        assert port is not None
        with connect(address, max_size=2**26) as socket:
            target = DevTools(socket).send("Target.createTarget", url="about:blank")["targetId"]
            page_address = f"ws://127.0.0.1:{port.group(1)}/devtools/page/{target}"
        with connect(page_address, max_size=2**26) as socket:
            yield DevTools(socket)
    finally:
        browser.terminate()
        browser.wait(timeout=10)
        if browser.stderr is not None:
            browser.stderr.close()


def navigate(page: DevTools, url: str) -> None:
    mark = len(page.events)
    page.send("Page.navigate", url=url)
    page.wait_for("Page.loadEventFired", after=mark)


def submit(page: DevTools, script: str) -> None:
    """Run ``script``, which submits a form, and wait for the page it leads to."""
    mark = len(page.events)
    page.evaluate(script)
    page.wait_for("Page.loadEventFired", after=mark)


def colour_pixels(png: bytes, colour: tuple[int, int, int]) -> int:
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).reshape(-1, 3)
    return int(np.sum(np.all(np.abs(pixels.astype(int) - colour) <= 8, axis=1)))


@pytest.mark.long  # Chromium starting and stopping: seconds
def test_the_page_signs_in_renders_the_figures_and_clears_the_alarm_in_chromium(
        tmp_path: Path) -> None:
    server, policy_id = serve(tmp_path)
    with server:
        for word in ("one", "two", "three", "four"):
            decide(server, f"state {word}")
        with chromium(tmp_path / "profile") as page:
            page.send("Page.enable")
            page.send("Network.enable")
            navigate(page, f"{server.url}/operator")
            assert page.evaluate("document.title") == "slotgate operator: sign in"
            submit(page, f"document.querySelector('input[name=key]').value = {ADMIN_KEY!r};"
                       "document.querySelector('form').submit()")
            dom = page.evaluate("document.documentElement.outerHTML")
            cookie = page.evaluate("document.cookie")
            figures = page.evaluate("[...document.querySelectorAll('[data-figure]')]"
                                    ".map(e => e.dataset.figure + ' ' + e.textContent)")
            rows = page.evaluate("document.querySelectorAll('#decisions tr').length")
            screenshot = base64.b64decode(page.send("Page.captureScreenshot",
                                                    format="png")["data"])
            # The clear button: the page's script asks first (a confirm), the form carries the
            # session's CSRF token and the browser its SameSite=Strict cookie (same origin).
            mark = len(page.events)
            page.evaluate("setTimeout(() => document.querySelector('form.clear button')"
                          ".click(), 0)")
            dialog = page.wait_for("Page.javascriptDialogOpening", after=mark)
            page.send("Page.handleJavaScriptDialog", accept=True)
            page.wait_for("Page.loadEventFired", after=mark)
            after_clear = page.evaluate("document.body.innerText")
            requested = [e["params"]["request"]["url"] for e in page.events
                         if e.get("method") == "Network.requestWillBeSent"]
        standing = app_state(server.app).service.monitor.watches[policy_id].alarms
    assert dialog["params"]["type"] == "confirm"
    assert "Cleared the alarms of policy" in after_clear and "None standing." in after_clear
    assert standing == {}
    (tmp_path / "operator.png").write_bytes(screenshot)  # kept beside the test's files
    assert "intents" in dom and policy_id in dom
    assert cookie == ""  # the session cookie is HttpOnly: no script on the page can read it
    assert figures[0].startswith("coverage 1.000 [") and figures[1].startswith("accuracy - [")
    assert rows == 5  # a header and the four decisions
    # The coverage interval's bar is drawn to scale (260 px for [0, 1], 12 px high; the mean's
    # tick and the tuning coverage's mark cover a little of it), in the colour the page's inline
    # CSS gives it: that CSS got past the page's own Content-Security-Policy. The accuracy
    # interval, with no label yet, has no bar.
    lower, upper = map(float, re.findall(r"\d\.\d{3}", figures[0])[1:])
    drawn = colour_pixels(screenshot, BAND)
    assert 0.75 < drawn / ((upper - lower) * 260 * 12) < 1.05, (drawn, lower, upper)
    assert colour_pixels(screenshot, TARGET) > 2 * 18, "no target mark or clear button"
    assert requested and all(url.startswith(server.url) for url in requested), requested

