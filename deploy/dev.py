#!/usr/bin/env python3
"""Set up funke on a fresh machine and run it: the README's two commands.

    python3 deploy/dev.py demo    # local multi-process cluster, word count, result and state history
    python3 deploy/dev.py test    # the whole test suite
    python3 deploy/dev.py stream  # the streaming word count, fed file by file, checked batch by batch
    python3 deploy/dev.py socket  # the seed's socket word count, fed by a line server, checked batch by batch
    python3 deploy/dev.py bench   # the benchmark suite: a table and a JSON file (about 20 minutes)
    python3 deploy/dev.py docs    # build the documentation site (docs/, mkdocs build --strict) into site/

Needs only Python >= 3.11 and Java 17. Creates `.venv` beside the checkout (override with
FUNKE_VENV) and installs funke into it, once per change of pyproject.toml, and makes the
class-data archive the TaskManagers' Spark JVMs start from, once per JDK and PySpark
(funke.taskmanager.jvmarchive: a cold start's JVM does about 40% less work). `test` also installs
the Debian packages `zookeeper`, `redis-server` and `chromium` when missing (the ZooKeeper HA
tests and the Redis Streams tests run real servers; the dashboard's tests a headless browser).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("FUNKE_VENV", ROOT / ".venv"))
STAMP = VENV / ".funke-install-stamp"


def _python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _say(msg: str) -> None:
    print(f"[funke] {msg}", file=sys.stderr, flush=True)


def ensure_environment() -> Path:
    if sys.version_info < (3, 11):
        sys.exit(f"funke needs Python >= 3.11; this is {sys.version.split()[0]}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        sys.exit("funke runs tasks on PySpark, which needs Java 17: install it or set JAVA_HOME")
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if not _python().exists():
        _say(f"creating virtual environment {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
    if not STAMP.exists() or STAMP.read_text().strip() != wanted:
        _say("installing funke and its dependencies (first run only; PySpark is large)")
        pip = [str(_python()), "-m", "pip", "--disable-pip-version-check", "-q"]
        subprocess.run(pip + ["install", "--upgrade", "pip"], check=True)
        subprocess.run(pip + ["install", "-e", f"{ROOT}[test]"], check=True, cwd=ROOT)
        STAMP.write_text(wanted)
    return _python()


def ensure_jvm_archive(python: Path) -> None:
    """The class-data archive of Spark's JVM (funke.taskmanager.jvmarchive), made when this
    JDK and PySpark have none yet; without it TaskManagers start as before, only slower. Making
    one prunes the cache: the archives of environments that are gone (an earlier clone's .venv)
    and the least recently used beyond FUNKE_CACHE_MAX_MB go, and are named here."""
    module = [str(python), "-m", "funke.taskmanager.jvmarchive"]
    if subprocess.call([*module, "--check"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0:
        return
    _say("making the class-data archive Spark's JVM starts from (first run only, a minute or so)")
    made = subprocess.run(module, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    if made.returncode != 0:
        tail = "\n".join(made.stderr.strip().splitlines()[-5:])
        _say(f"could not make it: TaskManagers start Spark without it (slower)\n{tail}")
        return
    for line in made.stderr.splitlines():
        if line.startswith("removed "):
            _say(f"class-data archive cache: {line}")


ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")


def ensure_zookeeper() -> None:
    """The tests of the ZooKeeper HA backend run a real server: Debian's package `zookeeper`,
    installed here when missing and possible (as root with apt-get). Otherwise those tests fail
    saying what to install."""
    if ZOOKEEPER_JAR.is_file() or os.environ.get("FUNKE_ZOOKEEPER_CLASSPATH"):
        return
    _install_debian_package("zookeeper", "ZooKeeper", "the high-availability tests", ZOOKEEPER_JAR.is_file)


def ensure_redis() -> None:
    """The Redis Streams tests run a real server: Debian's package `redis-server`, installed
    here when missing and possible; otherwise those tests fail saying what to install."""
    if shutil.which("redis-server") or os.environ.get("FUNKE_REDIS_SERVER"):
        return
    _install_debian_package("redis-server", "Redis", "the Redis Streams tests",
                            lambda: shutil.which("redis-server") is not None)


def ensure_chromium() -> None:
    """The web dashboard's tests drive a headless Chromium: Debian's package `chromium`,
    installed here when missing and possible. Otherwise those tests fail saying so."""
    if os.environ.get("FUNKE_CHROMIUM") or any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")):
        return
    _install_debian_package("chromium", "Chromium", "the web dashboard's tests",
                            lambda: shutil.which("chromium") is not None)


def _install_debian_package(package: str, what: str, needed_by: str, installed) -> None:
    if shutil.which("apt-get") is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        _say(f"{what} is not installed and cannot be installed from here (needs root and apt-get): "
             f"{needed_by} will fail; install the Debian package {package}")
        return
    _say(f"installing {what} (Debian package {package}) for {needed_by}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    quiet = {"stdout": subprocess.DEVNULL, "stdin": subprocess.DEVNULL, "env": env}
    if subprocess.call(["apt-get", "install", "-y", "-q", "--no-install-recommends", package], **quiet) != 0:
        subprocess.call(["apt-get", "update", "-q"], **quiet)  # a fresh machine's package lists may be empty
        subprocess.call(["apt-get", "install", "-y", "-q", "--no-install-recommends", package], **quiet)
    if not installed():
        _say(f"installing {what} failed: {needed_by} will fail")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test", "docs", "bench", "stream", "socket"):
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    python = ensure_environment()
    if command != "docs":
        ensure_jvm_archive(python)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if command == "test":
        ensure_zookeeper()
        ensure_redis()
        ensure_chromium()
        return subprocess.call([str(python), "-m", "pytest", *rest], cwd=ROOT, env=env)
    if command == "bench":
        ensure_zookeeper()  # the leader-kill figures on ZooKeeper
        ensure_redis()  # the Redis Streams kill runs
        return subprocess.call([str(python), str(ROOT / "tests" / "benchmarks" / "run_all.py"), *rest], cwd=ROOT, env=env)
    if command == "docs":
        site = ROOT / "site"
        env["NO_MKDOCS_2_WARNING"] = "1"
        code = subprocess.call([str(python), "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                                "-d", str(site), *rest], cwd=ROOT, env=env)
        if code == 0:
            _say(f"documentation built: {site / 'index.html'} (to read it while editing: "
                 f"{python.parent / 'mkdocs'} serve)")
        return code
    # The demos are scripts beside the example jobs they run (examples/demo.py, streamdemo.py,
    # socketdemo.py), run as modules of the checkout: they are not part of the installed package.
    module = {"stream": "examples.streamdemo", "socket": "examples.socketdemo"}.get(command, "examples.demo")
    return subprocess.call([str(python), "-m", module, *rest], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
