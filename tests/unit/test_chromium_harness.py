"""The headless-Chromium driver (tests/chromium.py) against a page served from a temp dir on
loopback: open/evaluate/wait_for, a trusted click whose confirm() is accepted, a full-page PNG,
console capture, wait_for timeouts, cookies, nothing of Chromium's left after the `with`, and
clear errors when Chromium cannot start, dies, or a page never loads.
Needs Debian's `chromium`; without it these tests fail (with the install hint), never skip."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.chromium import (Browser, ChromiumError, ChromiumMissing, ChromiumTimeout, JavaScriptError,
                            group_members, pids_naming)

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>funke harness</title></head>
<body>
  <h1 id="title">Dashboard</h1>
  <svg width="300" height="120"><rect id="bar" x="10" y="10" width="200" height="80" fill="#1f77b4"/></svg>
  <div style="height: 1800px"></div>
  <button id="go">Go</button>
  <script>
    console.error("deliberate error from the harness page");
    document.getElementById("go").addEventListener("click", (event) => {
      const ok = confirm("Really go?");
      document.body.dataset.trusted = String(event.isTrusted);
      if (ok) document.body.dataset.clicked = "yes";
    });
  </script>
</body></html>
"""


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a ThreadingHTTPServer on 127.0.0.1 serving index.html = PAGE."""
    root = tmp_path_factory.mktemp("site")
    (root / "index.html").write_text(PAGE)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _browser() -> Browser:
    try:
        return Browser()
    except ChromiumMissing as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def browser(site: str) -> Iterator[Browser]:
    with _browser() as b:
        b.open(site)
        yield b


def test_open_and_evaluate(browser: Browser) -> None:
    assert browser.evaluate("document.title") == "funke harness"
    assert browser.evaluate("document.querySelector('#bar').getAttribute('fill')") == "#1f77b4"
    assert browser.evaluate("({a: [1, 2.5, 'x', null], b: true})") == {"a": [1, 2.5, "x", None], "b": True}
    assert browser.evaluate("undefined") is None
    assert browser.evaluate("new Promise(r => setTimeout(() => r(42), 50))") == 42
    with pytest.raises(JavaScriptError, match="boom-123"):
        browser.evaluate("(() => { throw new Error('boom-123') })()")
    with pytest.raises(JavaScriptError, match="TypeError"):
        browser.evaluate("null.nothing")


def test_click_accepts_confirm(browser: Browser) -> None:
    assert browser.evaluate("window.scrollY") == 0   # the button is below the fold
    browser.click("#go")
    assert browser.wait_for("document.body.dataset.clicked", timeout=10, what="the click handler") == "yes"
    assert browser.evaluate("document.body.dataset.trusted") == "true"
    assert browser.dialogs() == [("confirm", "Really go?")]
    assert browser.evaluate("window.scrollY") > 0
    with pytest.raises(ChromiumError, match="no element matches"):
        browser.click("#missing")


def test_screenshot_is_a_full_page_png(browser: Browser, tmp_path: Path) -> None:
    out = browser.screenshot(tmp_path / "page.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 2000
    width, height = struct.unpack(">II", data[16:24])   # the IHDR chunk
    assert 1300 < width <= 1400 and height > 1800, (width, height)   # window 1400 wide less a scrollbar


def test_console_messages(browser: Browser) -> None:
    messages = browser.console_messages()
    assert "error: deliberate error from the harness page" in messages, messages
    browser.evaluate("setTimeout(() => { throw new Error('uncaught-456') }, 0)")
    browser.wait_for("new Promise(r => setTimeout(() => r(true), 50))", what="a tick")
    assert any(m.startswith("exception:") and "uncaught-456" in m for m in browser.console_messages())


def test_wait_for_times_out_naming_what(browser: Browser) -> None:
    began = time.monotonic()
    with pytest.raises(AssertionError, match="the impossible") as info:
        browser.wait_for("document.body.dataset.never", timeout=0.5, what="the impossible")
    assert "last value: None" in str(info.value)
    assert time.monotonic() - began < 10
    with pytest.raises(AssertionError, match="a throwing predicate"):
        browser.wait_for("null.nothing", timeout=0.3, what="a throwing predicate")


def test_set_cookie(site: str) -> None:
    with _browser() as b:
        b.set_cookie("funke", "42", site)
        b.open(site)
        assert "funke=42" in b.evaluate("document.cookie")


def test_nothing_left_after_exit(site: str) -> None:
    with _browser() as b:
        b.open(site)
        pid, tempdir = b.pid, b._dir
        assert pid is not None and tempdir is not None
        assert pid in group_members(pid) and len(group_members(pid)) > 1   # browser + zygotes/renderers
    assert not group_members(pid)
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between open and read
        state = None
    assert state in (None, "Z", "X")
    assert not os.path.exists(tempdir)
    assert not pids_naming(tempdir)   # the crashpad handlers, which leave the group, are gone too
    with pytest.raises(ChromiumError, match="not running"):
        b.evaluate("1")


def test_missing_chromium_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUNKE_CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(ChromiumMissing, match="Debian package `chromium`"):
        Browser()


def test_early_exit_reports_status_and_stderr(tmp_path: Path) -> None:
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\necho 'fatal: cannot frobnicate the display' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(ChromiumError, match=r"(?s)status 3.*cannot frobnicate"):
        Browser(str(fake)).start()


def test_dead_chromium_fails_fast(site: str) -> None:
    with _browser() as b:
        assert b.pid is not None
        os.kill(b.pid, signal.SIGKILL)
        began = time.monotonic()
        with pytest.raises(ChromiumError, match="status -9"):
            b.evaluate("1 + 1")
        assert time.monotonic() - began < 10


def test_page_that_never_loads(site: str) -> None:
    with socket.socket() as silent, _browser() as b:   # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        with pytest.raises(ChromiumTimeout, match="did not load within 1"):
            b.open(f"http://127.0.0.1:{silent.getsockname()[1]}/", timeout=1)
        b.open(site)   # the browser is usable again
        assert b.evaluate("document.title") == "funke harness"
