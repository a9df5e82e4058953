"""A class-data archive for the TaskManager's Spark JVM: its start-up classes loaded from a file.

A SparkSession's JVM loads, verifies and links some ten thousand classes of Spark, Scala and
their libraries while it starts and while it runs its first queries; on a 2-core machine that is
most of a TaskManager's start (about 10 s of CPU for the session, as much again for its first
job). JDK 17 can dump the classes a JVM loaded into an archive (-XX:ArchiveClassesAtExit) and
map them from it at the next start (-XX:SharedArchiveFile, application class-data sharing):
already parsed and verified, and shared between the JVMs that map it. Measured on this project's
2-core machine: a session's start 10 s -> 6 s of CPU, a session and its first job 23 s -> 14.5 s.

The archive belongs to one JVM build and one set of Spark jars (the JVM refuses one made by
another build or for other jars, and then starts without it, saying so in its log): its file
name carries a key of both, so a new JDK or PySpark simply finds no archive. It lives in
funke's cache directory ($FUNKE_CACHE_DIR, else $XDG_CACHE_HOME/funke, else ~/.cache/funke) and
is made once, by `python -m funke.taskmanager.jvmarchive` (which `deploy/dev.py` runs on setup):
a JVM started as a TaskManager starts one, which runs the warm-up jobs and stops; the archive
is written at its exit into a file of its own and renamed into place only once the JVM exited
cleanly, so a TaskManager never maps a half-written one. A TaskManager without an archive
starts as before.

The module imports nothing of PySpark at its top: finding the archive is cheap (a few stat calls).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

PREFIX = "spark-cds-"
SUFFIX = ".jsa"
# How long the JVM may take to write the archive once asked to exit (it writes ~200 MB).
DUMP_TIMEOUT_S = 300.0


def cache_dir() -> Path:
    explicit = os.environ.get("FUNKE_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "funke"


def spark_home() -> Path | None:
    """Where spark-submit takes the jars from: SPARK_HOME, else pip's PySpark."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    spec = importlib.util.find_spec("pyspark")
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def java_home() -> Path | None:
    """The JDK spark-submit runs: JAVA_HOME, else the `java` on PATH."""
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"])
    java = shutil.which("java")
    return Path(os.path.realpath(java)).parent.parent if java else None


def _stat_line(path: str) -> str:
    st = os.stat(path)
    return f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n"


def _install(spark: Path) -> str:
    """Which Spark installation (a virtual environment's PySpark, a SPARK_HOME) an archive is for."""
    return hashlib.sha256(str(spark.resolve()).encode()).hexdigest()[:8]


def key() -> str | None:
    """What the archive is valid for: this Spark installation, the JVM (its libjvm) and Spark's
    jars (names, sizes, times); None when either is not found."""
    spark, java = spark_home(), java_home()
    if spark is None or java is None:
        return None
    libjvm = sorted(glob.glob(str(java / "lib" / "*" / "libjvm.so")) + glob.glob(str(java / "jre" / "lib" / "*" / "*" / "libjvm.so")))
    jars = sorted(glob.glob(str(spark / "jars" / "*.jar")))
    if not libjvm or not jars:
        return None
    digest = hashlib.sha256()
    try:
        for path in [*libjvm, *jars]:
            digest.update(_stat_line(path).encode())
    except OSError:
        return None
    return f"{_install(spark)}-{digest.hexdigest()[:16]}"


def path() -> Path | None:
    """The archive's file for this JVM and these jars (it may not exist yet)."""
    k = key()
    return cache_dir() / f"{PREFIX}{k}{SUFFIX}" if k else None


def existing() -> Path | None:
    """The archive, if it was made for this JVM and these jars."""
    p = path()
    try:
        return p if p is not None and p.stat().st_size > 0 else None
    except OSError:
        return None


def java_option(archive: Path) -> str:
    """The JVM option that maps `archive` (quoted as Spark's launcher splits options)."""
    text = str(archive)
    return f'"-XX:SharedArchiveFile={text}"' if any(c.isspace() for c in text) else f"-XX:SharedArchiveFile={text}"


def build(target: Path) -> float:
    """Start a SparkSession as a TaskManager does, run the warm-up jobs, stop, and have the JVM
    write the archive of its classes at exit; once the JVM exited cleanly the archive is moved
    to `target`. Blocking, and only once per process (PySpark keeps one JVM per process).
    Returns the seconds it took; raises RuntimeError when no archive came of it."""
    from funke.taskmanager import sparksession, warmup

    started = time.monotonic()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    scratch = tempfile.mkdtemp(prefix="funke-jvm-archive-")
    try:
        plan = sparksession.plan(master=None, remote=None, slots=2, cores=2, user_conf=(), scratch=scratch,
                                 environ=os.environ, python=sys.executable)
        os.environ.update(plan.environ)
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.master(plan.target).appName("funke-jvm-archive")
        for k, v in plan.conf.items():
            if k == sparksession.DRIVER_JAVA_OPTIONS:
                # its warnings (classes it cannot archive: signed jars, old class files) are not ours
                v = f"{v} -XX:ArchiveClassesAtExit={partial} -Xlog:cds*=error"
            builder = builder.config(k, v)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
        warmup.run(spark, scratch)
        spark.stop()
        gateway = SparkContext._gateway
        proc = getattr(gateway, "proc", None)
        if proc is None:
            raise RuntimeError("PySpark did not start a JVM of its own (is PYSPARK_GATEWAY_PORT set?)")
        gateway.shutdown()
        proc.stdin.close()  # the JVM exits when its stdin ends, and writes the archive
        code = proc.wait(DUMP_TIMEOUT_S)
        if code != 0 or not partial.is_file() or partial.stat().st_size == 0:
            raise RuntimeError(f"the JVM exited with code {code} and wrote no archive")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
    install = target.name[len(PREFIX):].split("-")[0]
    for old in target.parent.glob(f"{PREFIX}{install}-*{SUFFIX}"):  # this installation's, for an older JDK or jars
        if old != target:  # (other installations' archives are theirs)
            old.unlink(missing_ok=True)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m funke.taskmanager.jvmarchive",
        description="Make the class-data archive TaskManagers start their Spark JVM from (once per JDK and PySpark).")
    parser.add_argument("--force", action="store_true", help="make it again even if there is one")
    parser.add_argument("--check", action="store_true", help="only say whether there is one (exit 0) or not (exit 1)")
    args = parser.parse_args(argv)
    target = path()
    if target is None:
        print("no JDK or no Spark jars found (JAVA_HOME, java on PATH, SPARK_HOME or pip's PySpark)", file=sys.stderr)
        return 2
    if existing() is not None and not args.force:
        print(target)
        return 0
    if args.check:
        print(f"no class-data archive yet ({target})", file=sys.stderr)
        return 1
    try:
        took = build(target)
    except Exception as exc:  # the TaskManagers start without one, as before
        print(f"could not make the class-data archive: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"{target} ({target.stat().st_size / 2**20:.0f} MiB, made in {took:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
