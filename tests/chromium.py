"""A small synchronous driver for headless Chromium over the Chrome DevTools Protocol (CDP), for
integration tests that load a web page, read the DOM, click and save screenshots.

    from tests.chromium import Browser, ChromiumMissing

    try:
        browser = Browser()
    except ChromiumMissing as exc:
        pytest.fail(str(exc), pytrace=False)       # never skip: the browser is a test dependency
    with browser:
        browser.open("http://127.0.0.1:8080/")
        browser.wait_for("document.querySelectorAll('svg rect').length > 0", what="the chart")
        browser.click("#cancel")                   # a trusted mouse click; confirm() is accepted
        browser.screenshot(tmp_path / "dashboard.png")
        assert not [m for m in browser.console_messages() if m.startswith(("error", "exception"))]

Each Browser runs its own Chromium (Debian's `chromium`, or $FUNKE_CHROMIUM) in a new process
group with a temp dir for the profile, its stderr and its XDG config/cache (else crash reports land
in ~/.config/chromium), and drives the page target over a websocket (aiohttp) from an asyncio loop
in a background thread. Every CDP call has a timeout; if Chromium dies, calls fail with its exit
status and stderr tail. close() stops only what it started: its process group, then its crashpad
handlers (outside the group, but their command line names our temp dir).
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import concurrent.futures
import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Coroutine, TypeVar

import aiohttp

T = TypeVar("T")
INSTALL_HINT = "install the Debian package `chromium` (apt-get install -y --no-install-recommends chromium)"
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--no-default-browser-check", "--remote-debugging-port=0"]


class ChromiumError(RuntimeError):
    """Chromium failed to start or died, or a CDP call failed."""


class ChromiumTimeout(ChromiumError):
    """A CDP call got no answer, or a page did not load, in time."""


class ChromiumMissing(ChromiumError):
    """No Chromium binary; the message says what to install."""


class JavaScriptError(ChromiumError):
    """An expression given to evaluate() threw; the message holds the JS exception text."""


def find_chromium() -> str | None:
    """$FUNKE_CHROMIUM if set (None if that is no executable), else chromium, chromium-browser or
    google-chrome on PATH."""
    if env := os.environ.get("FUNKE_CHROMIUM"):
        return shutil.which(env)
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


def group_members(pgid: int) -> list[int]:
    """PIDs of the live (not zombie) processes in process group `pgid`."""
    return [pid for pid, stat, _ in _processes() if stat[0] not in "ZX" and int(stat[2]) == pgid]


def pids_naming(text: str) -> list[int]:
    """PIDs of the live processes whose command line contains `text`."""
    return [pid for pid, stat, cmd in _processes() if stat[0] not in "ZX" and text.encode() in cmd]


def _processes() -> list[tuple[int, list[str], bytes]]:
    """(pid, /proc/pid/stat fields after "pid (comm)", cmdline) of every other process."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            found.append((int(entry), stat[stat.rindex(")") + 2:].split(), cmdline))
    return [p for p in found if p[0] != os.getpid()]


class Browser:
    """One headless Chromium with one page; a context manager (or call start() and close())."""

    def __init__(self, executable: str | None = None, *, timeout: float = 30.0, startup_timeout: float = 60.0,
                 window_size: tuple[int, int] = (1400, 1000), extra_args: list[str] | None = None) -> None:
        self.executable = executable or find_chromium()
        if self.executable is None:
            env = os.environ.get("FUNKE_CHROMIUM")
            why = f" ($FUNKE_CHROMIUM={env!r} is no executable)" if env else ""
            raise ChromiumMissing(f"Chromium not found{why}: {INSTALL_HINT}")
        self.timeout, self.startup_timeout = timeout, startup_timeout
        self.window_size, self.extra_args = window_size, list(extra_args or [])
        self.pid: int | None = None                 # the browser process, leader of its own group
        self.startup_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._connected = False
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._loads: set[str] = set()               # loaderIds whose "load" lifecycle event came
        self._load_event: asyncio.Event | None = None
        self._console: list[str] = []
        self._dialogs: list[tuple[str, str]] = []

    def __enter__(self) -> Browser:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start Chromium and attach to its page (within startup_timeout seconds)."""
        began = time.monotonic()
        deadline = began + self.startup_timeout
        self._dir = tempfile.mkdtemp(prefix="funke-chromium-")
        atexit.register(self.close)
        try:
            profile = os.path.join(self._dir, "profile")
            env = dict(os.environ, XDG_CONFIG_HOME=os.path.join(self._dir, "xdg-config"),
                       XDG_CACHE_HOME=os.path.join(self._dir, "xdg-cache"))
            argv = [self.executable, *FLAGS, f"--user-data-dir={profile}",
                    "--window-size={},{}".format(*self.window_size), *self.extra_args, "about:blank"]
            with open(os.path.join(self._dir, "stderr.log"), "wb") as err:
                self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                              stderr=err, env=env, start_new_session=True)
            self.pid = self._proc.pid
            port_file = Path(profile, "DevToolsActivePort")
            while not ((lines := _read_lines(port_file)) and len(lines) >= 2 and lines[0].isdigit()):
                if self._proc.poll() is not None:
                    raise ChromiumError(f"Chromium failed to start{self._stderr_tail()}")
                if time.monotonic() > deadline:
                    raise ChromiumTimeout(f"no {port_file} after {self.startup_timeout}s"
                                          f"{self._stderr_tail()}")
                time.sleep(0.05)
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="chromium-cdp", daemon=True)
            self._thread.start()
            self._run(lambda: self._connect(int(lines[0]), deadline), deadline - time.monotonic())
            self.startup_seconds = time.monotonic() - began
        except BaseException:
            self.close()
            raise

    async def _connect(self, port: int, deadline: float) -> None:
        self._load_event, self._session = asyncio.Event(), aiohttp.ClientSession()
        url = None
        while url is None:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                async with self._session.get(f"http://127.0.0.1:{port}/json",
                                             timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    url = next((t["webSocketDebuggerUrl"] for t in await resp.json(content_type=None)
                                if t.get("type") == "page" and "webSocketDebuggerUrl" in t), None)
            if url is None:
                if time.monotonic() > deadline or self._proc is None or self._proc.poll() is not None:
                    raise ChromiumError(f"no page target on DevTools port {port}{self._stderr_tail()}")
                await asyncio.sleep(0.1)
        self._ws = await self._session.ws_connect(url, max_msg_size=0)   # screenshots are big
        self._connected = True
        self._reader_task = asyncio.get_running_loop().create_task(self._reader())
        for method, params in (("Page.enable", {}), ("Runtime.enable", {}),
                               ("Page.setLifecycleEventsEnabled", {"enabled": True})):
            await self._send(method, params)

    def close(self) -> None:
        """Stop Chromium's process group, drop the connection, wait out (or kill) the crashpad
        handlers, remove the temp dir. Idempotent, also after Chromium died."""
        atexit.unregister(self.close)
        if (proc := self._proc) is not None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)   # our own group (start_new_session), never anyone else's
                end = time.monotonic() + 10
                while (proc.poll() is None or group_members(proc.pid)) and time.monotonic() < end:
                    time.sleep(0.05)
                if proc.poll() is not None and not group_members(proc.pid):
                    break
            self._proc = None
        if self._loop is not None and self._thread is not None:
            if self._thread.is_alive():
                with contextlib.suppress(Exception):
                    self._run(self._disconnect, 10)
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(10)
            if not self._thread.is_alive():
                self._loop.close()
            self._loop = self._thread = None
        if self._dir is not None:
            end = time.monotonic() + 5   # crashpad handlers exit by themselves once the browser is gone
            while (left := pids_naming(self._dir)) and time.monotonic() < end:
                time.sleep(0.05)
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    async def _disconnect(self) -> None:
        try:
            if self._ws is not None:
                await asyncio.wait_for(self._ws.close(), 5)
            if self._reader_task is not None:
                await asyncio.wait_for(self._reader_task, 5)
        finally:
            if self._session is not None:
                await self._session.close()

    # -- CDP plumbing ----------------------------------------------------------------------------
    def _run(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float) -> T:
        if self._loop is None:
            raise ChromiumError("the browser is not running (use it inside `with Browser() as b:`)")
        future = asyncio.run_coroutine_threadsafe(make(), self._loop)
        try:
            return future.result(max(timeout, 0) + 10)   # the coroutine's own timeout fires first
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ChromiumTimeout(f"no answer from the CDP thread within {timeout}s") from None

    def _call(self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        timeout = self.timeout if timeout is None else timeout
        return self._run(lambda: self._send(method, params, timeout), timeout)

    async def _send(self, method: str, params: dict[str, Any] | None = None,
                    timeout: float | None = None) -> Any:
        timeout = self.timeout if timeout is None else timeout
        if not self._connected or self._ws is None:
            raise ChromiumError(f"{method}: the DevTools connection is closed{self._stderr_tail()}")
        ident = next(self._ids)
        self._pending[ident] = future = asyncio.get_running_loop().create_future()
        try:
            try:
                await self._ws.send_str(json.dumps({"id": ident, "method": method, "params": params or {}}))
            except (ConnectionError, aiohttp.ClientError) as exc:   # Chromium just died: say how
                if self._reader_task is not None:
                    await asyncio.wait({self._reader_task}, timeout=2)
                raise ChromiumError(f"{method}: could not send ({exc}){self._stderr_tail()}") from None
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise ChromiumTimeout(f"{method}: no answer within {timeout}s{self._stderr_tail()}") from None
        finally:
            self._pending.pop(ident, None)

    async def _reader(self) -> None:
        assert self._ws is not None and self._load_event is not None
        try:
            async for msg in self._ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    try:
                        self._dispatch(json.loads(msg.data))
                    except Exception as exc:   # one odd message must not stop the reader
                        self._console.append(f"driver: could not handle a CDP message: {exc!r}")
        finally:
            self._connected = False
            for _ in range(20):   # if Chromium died, let its exit status into the error
                if self._proc is None or self._proc.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            error = ChromiumError(f"the DevTools connection closed{self._stderr_tail()}")
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(error)
            self._load_event.set()

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if "id" in msg:
            future = self._pending.get(msg["id"])
            if future is not None and not future.done():
                if (err := msg.get("error")) is not None:
                    future.set_exception(ChromiumError(f"CDP error {err.get('code')}: {err.get('message')} "
                                                       f"{err.get('data', '')}".rstrip()))
                else:
                    future.set_result(msg.get("result", {}))
            return
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.consoleAPICalled":
            self._console.append(f"{params.get('type')}: " + " ".join(map(_describe, params.get("args", []))))
        elif method == "Runtime.exceptionThrown":
            self._console.append(f"exception: {_exception_text(params.get('exceptionDetails', {}))}")
        elif method == "Page.javascriptDialogOpening":   # answered from a task: the reader must go on
            self._dialogs.append((params.get("type", ""), params.get("message", "")))
            answer = {"accept": True, "promptText": params.get("defaultPrompt", "")}
            task = asyncio.get_running_loop().create_task(self._send("Page.handleJavaScriptDialog", answer))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())   # no "never retrieved"
        elif method == "Page.lifecycleEvent" and params.get("name") == "load" and self._load_event:
            self._loads.add(params.get("loaderId", ""))
            self._load_event.set()

    def _stderr_tail(self, lines: int = 15) -> str:
        rc = self._proc.poll() if self._proc is not None else None
        text = [line for line in _read_lines(Path(self._dir or "/nonexistent", "stderr.log"))
                if line.strip() and "dbus" not in line.lower()]   # no D-Bus here: pure noise
        return ((f"; Chromium exited with status {rc}" if rc is not None else "")
                + ("\nlast lines of Chromium's stderr:\n  " + "\n  ".join(text[-lines:]) if text else ""))

    # -- the page --------------------------------------------------------------------------------
    def open(self, url: str, timeout: float = 30.0) -> None:
        """Navigate to `url` and wait for its load event; on timeout stop loading and raise
        ChromiumTimeout (a navigation that never commits would block every later call)."""
        async def go() -> None:
            end = time.monotonic() + timeout
            try:
                result = await self._send("Page.navigate", {"url": url}, timeout)
                if result.get("errorText"):
                    raise ChromiumError(f"could not open {url}: {result['errorText']}")
                loader = result.get("loaderId")   # none for a same-document navigation (#fragment)
                while loader and loader not in self._loads and self._load_event is not None:
                    if not self._connected:
                        raise ChromiumError(f"Chromium went away while loading {url}{self._stderr_tail()}")
                    self._load_event.clear()
                    await asyncio.wait_for(self._load_event.wait(), max(end - time.monotonic(), 0))
            except (asyncio.TimeoutError, ChromiumTimeout):
                if self._connected:
                    with contextlib.suppress(ChromiumError):
                        await self._send("Page.stopLoading", timeout=5)
                raise ChromiumTimeout(f"{url} did not load within {timeout}s (loading stopped)") from None
        self._run(go, timeout)

    def evaluate(self, expression: str, timeout: float | None = None) -> Any:
        """The value of a JS expression (promises awaited) as JSON-like Python data (DOM nodes come
        back as {}). Raises JavaScriptError, with the exception text, if it throws."""
        reply = self._call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True, "userGesture": True}, timeout)
        if "exceptionDetails" in reply:
            raise JavaScriptError(f"{expression!r} threw: {_exception_text(reply['exceptionDetails'])}")
        result = reply.get("result", {})
        if "unserializableValue" in result:   # NaN, Infinity, -0, 123n
            raw = result["unserializableValue"]
            return int(raw[:-1]) if raw.endswith("n") else float(raw)
        return result.get("value")

    def wait_for(self, predicate: str, timeout: float = 30.0, what: str = "the condition",
                 interval: float = 0.1) -> Any:
        """Poll the JS expression `predicate` until it is truthy (by JS rules; a throw counts as
        not yet) and return its value. On timeout raise AssertionError naming `what`."""
        expr = predicate.strip().rstrip(";")
        probe = f"(async () => {{ const v = await ({expr}); return {{ok: !!v, v}}; }})()"
        end, last = time.monotonic() + timeout, None
        while True:
            try:
                result = self.evaluate(probe, timeout=max(min(end - time.monotonic(), self.timeout), 1.0))
                if result["ok"]:
                    return result.get("v")
                last = result.get("v")
            except JavaScriptError as exc:
                last = f"<{exc}>"
            if time.monotonic() >= end:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}: {predicate} "
                                     f"(last value: {last!r})")
            time.sleep(interval)

    def click(self, selector: str) -> None:
        """Scroll the first element matching the CSS selector into view and click its centre with
        real (trusted) mouse events. Raises ChromiumError if there is no such element, it has no
        size, or another element covers its centre."""
        where = self.evaluate(f"""(() => {{
            const el = document.querySelector({json.dumps(selector)});
            if (!el) return null;
            el.scrollIntoView({{block: "center", inline: "center", behavior: "instant"}});
            const r = el.getBoundingClientRect(), x = r.left + r.width / 2, y = r.top + r.height / 2;
            const hit = document.elementFromPoint(x, y);
            return {{x, y, w: r.width, h: r.height, covered: !!hit && hit !== el && !el.contains(hit),
                     hit: hit && hit.outerHTML.slice(0, 120)}};
        }})()""")
        if where is None:
            raise ChromiumError(f"click: no element matches {selector!r}")
        if not where["w"] or not where["h"]:
            raise ChromiumError(f"click: {selector!r} has no size (hidden?)")
        if where["covered"]:
            raise ChromiumError(f"click: {selector!r} is covered at its centre by {where['hit']}")
        for kind, button, buttons, count in (("mouseMoved", "none", 0, 0), ("mousePressed", "left", 1, 1),
                                             ("mouseReleased", "left", 0, 1)):
            self._call("Input.dispatchMouseEvent", {"type": kind, "x": where["x"], "y": where["y"],
                                                    "button": button, "buttons": buttons, "clickCount": count})

    def screenshot(self, path: str | os.PathLike[str], full_page: bool = True) -> Path:
        """Save a PNG of the whole document (full_page) or of the viewport; returns the path."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = self._call("Page.getLayoutMetrics")
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            width, height = math.ceil(size["width"]), min(math.ceil(size["height"]), 16384)
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1})
        out = Path(path)
        out.write_bytes(base64.b64decode(self._call("Page.captureScreenshot", params)["data"]))
        return out

    def set_cookie(self, name: str, value: str, url: str) -> None:
        """Set a cookie for `url` (call before opening it)."""
        reply = self._call("Network.setCookie", {"name": name, "value": value, "url": url})
        if reply.get("success") is False:
            raise ChromiumError(f"Chromium refused cookie {name!r} for {url}")

    def console_messages(self) -> list[str]:
        """All the page logged so far, as "<level>: <text>" (level: log, info, warning, error,
        debug, ...); uncaught exceptions as "exception: <text>"."""
        return list(self._console)

    def dialogs(self) -> list[tuple[str, str]]:
        """(type, message) of each JS dialog (alert, confirm, prompt, beforeunload) so far; all accepted."""
        return list(self._dialogs)


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def _describe(arg: dict[str, Any]) -> str:
    if "value" in arg:
        return arg["value"] if isinstance(arg["value"], str) else json.dumps(arg["value"])
    return str(arg.get("unserializableValue") or arg.get("description") or arg.get("type", "?"))


def _exception_text(details: dict[str, Any]) -> str:
    exc = details.get("exception") or {}
    return str(exc.get("description") or exc.get("value") or details.get("text") or "unknown JS exception")
