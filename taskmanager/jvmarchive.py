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

Each archive (about 185 MB) has a record beside it, `spark-cds-<key>.json`: the Spark
installation and the JDK it was made for, the Python environment that made it, and (its time)
when a TaskManager last started from it. Every time an archive is made, the cache is pruned
(`prune`, also `--prune`): archives whose Spark installation is gone (a virtual environment
deleted, a fresh clone's `.venv` removed with the clone) or changed (other jars, another JDK:
no JVM would map them any more) go, and so do records without an archive and half-written
archives of builds that died; then, least recently used first, archives beyond the cache's cap
(`FUNKE_CACHE_MAX_MB`, default 2048 MiB, about eleven archives; this environment's archive is
always kept). An archive made before records were kept gets its record when a TaskManager
starts from it; until then only the cap removes it.
Removing an archive never breaks a JVM started from it: the JVM mapped the file at its start
and holds the mapping, and an unlinked file stays on disk until its last mapping goes (Linux,
POSIX file systems); archives are only ever replaced by a rename, never rewritten in place
(truncating a mapped file would crash the JVMs mapping it); tests/integration/test_jvmarchive.py
removes the archive under a running session and runs a job. `--clear` removes every archive,
`--list` shows them.

The module imports nothing of PySpark at its top: finding the archive is cheap (a few stat calls).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

PREFIX = "spark-cds-"
SUFFIX = ".jsa"
RECORD_SUFFIX = ".json"
PARTIAL_SUFFIX = ".partial"
# The cache's cap (MiB), and the variable that changes it.
MAX_MB_VARIABLE = "FUNKE_CACHE_MAX_MB"
DEFAULT_MAX_MB = 2048
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
    return _key_for(spark, java)


def _key_for(spark: Path, java: Path) -> str | None:
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


def record_path(archive: Path) -> Path:
    """The record beside an archive: what it was made for, and when it was last used."""
    return archive.with_name(archive.name[: -len(SUFFIX)] + RECORD_SUFFIX)


def used(archive: Path) -> None:
    """A TaskManager starts from `archive` (`existing()`: this environment's): its record's time
    says so (the cap removes the least recently used archives first), and an archive made before
    records were kept gets one. Best effort: a cache the TaskManager cannot write changes nothing
    of its start."""
    with contextlib.suppress(OSError):
        try:
            os.utime(record_path(archive))
        except FileNotFoundError:
            spark, java = spark_home(), java_home()
            if spark is not None and java is not None:
                _write_record(archive, spark, java)


def _write_record(archive: Path, spark: Path, java: Path) -> None:
    # the paths as `key` used them (its digest covers the jars' paths): `prune` computes it again
    record = {"spark_home": str(spark), "java_home": str(java), "python": sys.executable,
              "environment": sys.prefix, "recorded": time.time()}
    final = record_path(archive)
    partial = final.with_name(f".{final.name}.{os.getpid()}{PARTIAL_SUFFIX}")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(partial, final)


def _read_record(archive: Path) -> dict | None:
    try:
        record = json.loads(record_path(archive).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("spark_home"), str) \
            or not isinstance(record.get("java_home"), str):
        return None
    return record


def java_option(archive: Path) -> str:
    """The JVM option that maps `archive` (quoted as Spark's launcher splits options)."""
    text = str(archive)
    return f'"-XX:SharedArchiveFile={text}"' if any(c.isspace() for c in text) else f"-XX:SharedArchiveFile={text}"


def build(target: Path) -> float:
    """Start a SparkSession as a TaskManager does, run the warm-up jobs, stop, and have the JVM
    write the archive of its classes at exit; once the JVM exited cleanly the archive is moved
    to `target`, and its record written beside it. Blocking, and only once per process (PySpark
    keeps one JVM per process). Returns the seconds it took; raises RuntimeError when no archive
    came of it."""
    started = time.monotonic()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}{PARTIAL_SUFFIX}")
    scratch = tempfile.mkdtemp(prefix="funke-jvm-archive-")
    try:
        _dump_classes(partial, scratch)
        if not partial.is_file() or partial.stat().st_size == 0:
            raise RuntimeError("the JVM wrote no archive")
        os.replace(partial, target)  # a new file: a JVM mapping the one it replaces keeps that
        spark, java = spark_home(), java_home()
        if spark is not None and java is not None:
            _write_record(target, spark, java)
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
    return time.monotonic() - started


def _dump_classes(partial: Path, scratch: str) -> None:
    """The JVM's part of `build`: a session started, warmed up and stopped, the JVM's classes
    written to `partial` at its exit."""
    from funke.taskmanager import sparksession, warmup

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
    if code != 0:
        raise RuntimeError(f"the JVM exited with code {code} and wrote no archive")


def max_bytes() -> int:
    """The cache's cap, from FUNKE_CACHE_MAX_MB (MiB, a whole number; 0 keeps only the archive of
    the environment pruning), else DEFAULT_MAX_MB."""
    text = os.environ.get(MAX_MB_VARIABLE, "").strip()
    if not text:
        return DEFAULT_MAX_MB * 2**20
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"{MAX_MB_VARIABLE} must be a whole number of MiB (0 or more), got {text[:40]!r}")
    return int(text) * 2**20


def prune(keep: Path | None = None, limit: int | None = None) -> list[tuple[Path, str]]:
    """Remove from the cache what no JVM will start from, then what is beyond the cap (`limit`
    bytes, else `max_bytes()`), least recently used first; `keep` (this environment's archive)
    always stays. Returns each file removed with why. Safe while other processes use the cache:
    a JVM keeps the archive it started from mapped, another prune's removals are tolerated, and
    a build under way (its process alive) keeps its half-written archive."""
    directory = cache_dir()
    limit = max_bytes() if limit is None else limit
    removed: list[tuple[Path, str]] = []

    def remove(p: Path, why: str) -> None:
        try:
            p.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:  # not ours to remove (another user's cache): say so, go on
            removed.append((p, f"NOT removed ({exc.strerror or exc}): {why}"))
            return
        removed.append((p, why))
        if p.name.endswith(SUFFIX):
            with contextlib.suppress(OSError):
                record_path(p).unlink()

    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return removed
    for name in names:  # builds that died before renaming their archive (or record) into place
        if name.startswith("." + PREFIX) and name.endswith(PARTIAL_SUFFIX):
            pid = name[: -len(PARTIAL_SUFFIX)].rpartition(".")[2]
            if not pid.isdigit() or not _alive(int(pid)):
                remove(directory / name, "a build that did not finish")
    current = key()
    current_install = current.split("-")[0] if current else None
    archives: list[Path] = []
    for name in names:
        if not (name.startswith(PREFIX) and name.endswith(SUFFIX)):
            continue
        archive = directory / name
        if archive == keep:
            archives.append(archive)
            continue
        why = _stale(archive, current, current_install)
        if why:
            remove(archive, why)
        else:
            archives.append(archive)
    for name in names:
        if name.startswith(PREFIX) and name.endswith(RECORD_SUFFIX):
            if not (directory / (name[: -len(RECORD_SUFFIX)] + SUFFIX)).exists():
                remove(directory / name, "a record without its archive")

    def last_used(archive: Path) -> float:
        for p in (record_path(archive), archive):
            with contextlib.suppress(OSError):
                return p.stat().st_mtime
        return 0.0

    total = 0
    for archive in sorted(archives, key=lambda a: (a != keep, -last_used(a))):
        try:
            size = archive.stat().st_size
        except OSError:
            continue
        if archive != keep and total + size > limit:
            remove(archive, f"beyond the cache's cap of {limit / 2**20:g} MiB ({MAX_MB_VARIABLE}), the least "
                            "recently used")
            continue
        total += size
    return removed


def _stale(archive: Path, current: str | None, current_install: str | None) -> str | None:
    """Why no JVM will start from `archive` any more, or None."""
    archive_key = archive.name[len(PREFIX): -len(SUFFIX)]
    record = _read_record(archive)
    if record is None:  # made before records were kept: only this installation's can be judged
        if current_install is not None and archive_key.split("-")[0] == current_install and archive_key != current:
            return "made for other jars or another JDK of this Spark installation"
        return None
    spark, java = Path(record["spark_home"]), Path(record["java_home"])
    if not (spark / "jars").is_dir():
        return f"its Spark installation {spark} is gone (environment {record.get('environment', '?')})"
    if _key_for(spark, java) != archive_key:
        return f"made for other jars or another JDK than {spark} has now"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def describe() -> list[str]:
    """A line per archive in the cache: its size, last use and what it was made for."""
    lines = []
    directory = cache_dir()
    for archive in sorted(directory.glob(f"{PREFIX}*{SUFFIX}")):
        record = _read_record(archive)
        try:
            size = archive.stat().st_size
            used_at = (record_path(archive) if record else archive).stat().st_mtime
        except OSError:
            continue
        what = (f"Spark {record['spark_home']}, environment {record.get('environment', '?')}" if record
                else "made before funke recorded what for")
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(used_at))
        lines.append(f"{archive}  {size / 2**20:.0f} MiB  last used {when}  {what}")
    return lines


def clear() -> list[Path]:
    """Remove every archive and record from the cache (a build under way keeps its own)."""
    removed = []
    directory = cache_dir()
    for p in sorted(directory.glob(f"{PREFIX}*")):
        if p.name.endswith((SUFFIX, RECORD_SUFFIX)):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed.append(p)
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m funke.taskmanager.jvmarchive",
        description="Make the class-data archive TaskManagers start their Spark JVM from (once per JDK and PySpark).")
    parser.add_argument("--force", action="store_true", help="make it again even if there is one")
    parser.add_argument("--check", action="store_true", help="only say whether there is one (exit 0) or not (exit 1)")
    parser.add_argument("--list", action="store_true", help="list the archives in the cache and what they are for")
    parser.add_argument("--prune", action="store_true",
                        help="only remove the archives no JVM will use (environment gone, jars or JDK changed) "
                             f"and those beyond the cap ({MAX_MB_VARIABLE}, default {DEFAULT_MAX_MB} MiB)")
    parser.add_argument("--clear", action="store_true", help="remove every archive from the cache")
    args = parser.parse_args(argv)
    if args.list:
        print(f"{cache_dir()}:")
        for line in describe():
            print(line)
        return 0
    if args.clear:
        for p in clear():
            print(f"removed {p}")
        return 0
    if not args.check:
        try:
            max_bytes()  # before an archive is made, not after a minute of it
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
    if args.prune:
        _prune_and_say(existing())
        return 0
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
    _prune_and_say(target)
    return 0


def _prune_and_say(keep: Path | None) -> None:
    for p, why in prune(keep):
        print(f"removed {p}: {why}" if not why.startswith("NOT removed") else f"{p}: {why}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
