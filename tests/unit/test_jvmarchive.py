"""Which class-data archive a TaskManager's Spark JVM maps: one per JVM build and set of Spark
jars, in funke's cache directory, and none where it was not made (pure file look-ups; making an
archive starts a JVM and is left to `python -m funke.taskmanager.jvmarchive`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from funke.taskmanager import jvmarchive


@pytest.fixture
def homes(tmp_path, monkeypatch):
    spark, java, cache = tmp_path / "spark", tmp_path / "jdk", tmp_path / "cache"
    (spark / "jars").mkdir(parents=True)
    (java / "lib" / "server").mkdir(parents=True)
    for name in ("spark-core.jar", "scala-library.jar"):
        (spark / "jars" / name).write_bytes(b"jar " + name.encode())
    (java / "lib" / "server" / "libjvm.so").write_bytes(b"jvm")
    monkeypatch.setenv("SPARK_HOME", str(spark))
    monkeypatch.setenv("JAVA_HOME", str(java))
    monkeypatch.setenv("FUNKE_CACHE_DIR", str(cache))
    return spark, java, cache


def test_the_archive_is_named_after_the_jvm_and_the_jars_and_found_once_made(homes):
    spark, java, cache = homes
    target = jvmarchive.path()
    assert target is not None and target.parent == cache and target.name.startswith(jvmarchive.PREFIX)
    assert jvmarchive.existing() is None  # not made yet: the TaskManager starts without
    cache.mkdir()
    target.write_bytes(b"archive")
    assert jvmarchive.existing() == target
    assert jvmarchive.java_option(target) == f"-XX:SharedArchiveFile={target}"


@pytest.mark.parametrize("change", ["new jar", "jar rewritten", "another jvm"])
def test_another_pyspark_or_jdk_finds_no_archive(homes, change):
    spark, java, cache = homes
    before = jvmarchive.path()
    cache.mkdir()
    before.write_bytes(b"archive")
    if change == "new jar":
        (spark / "jars" / "spark-sql.jar").write_bytes(b"jar")
    elif change == "jar rewritten":
        jar = spark / "jars" / "spark-core.jar"
        jar.write_bytes(b"jar spark-core.jar, a later build")
    else:
        libjvm = java / "lib" / "server" / "libjvm.so"
        os.utime(libjvm, ns=(1, 1))
    assert jvmarchive.path() != before and jvmarchive.existing() is None


def test_without_a_jdk_or_spark_jars_there_is_no_archive_to_look_for(homes, monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    assert jvmarchive.key() is None and jvmarchive.path() is None and jvmarchive.existing() is None


def test_a_path_with_spaces_is_quoted_as_sparks_launcher_splits_options():
    assert jvmarchive.java_option(Path("/a b/x.jsa")) == '"-XX:SharedArchiveFile=/a b/x.jsa"'


def test_the_cache_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("FUNKE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert jvmarchive.cache_dir() == tmp_path / "xdg" / "funke"
    monkeypatch.setenv("FUNKE_CACHE_DIR", str(tmp_path / "mine"))
    assert jvmarchive.cache_dir() == tmp_path / "mine"


def test_each_spark_installation_has_its_own_archive(homes, tmp_path, monkeypatch):
    # two virtual environments on one machine share the cache directory, not their archives
    first = jvmarchive.path()
    other = tmp_path / "other-venv-spark"
    (other / "jars").mkdir(parents=True)
    (other / "jars" / "spark-core.jar").write_bytes(b"jar spark-core.jar")
    monkeypatch.setenv("SPARK_HOME", str(other))
    second = jvmarchive.path()
    assert first != second and first.parent == second.parent
    assert first.name.split("-")[2] != second.name.split("-")[2]  # spark-cds-<installation>-<contents>.jsa


# ---------------------------------------------------------------------------- the cache kept in bounds
# Every archive here is made into the test's own cache directory (the fixture's FUNKE_CACHE_DIR),
# by a stand-in for the JVM's dump: the user's cache is never touched.

MiB = 2**20


def environment(tmp_path: Path, name: str) -> Path:
    """A Spark installation of its own (another virtual environment's PySpark)."""
    spark = tmp_path / name
    (spark / "jars").mkdir(parents=True)
    (spark / "jars" / "spark-core.jar").write_bytes(b"jar of " + name.encode())
    return spark


def made(monkeypatch, spark: Path, size: int = 1000, *, used_at: float | None = None) -> Path:
    """`python -m funke.taskmanager.jvmarchive` run in the environment of `spark`, the JVM's dump
    replaced by `size` bytes."""
    monkeypatch.setenv("SPARK_HOME", str(spark))
    monkeypatch.setattr(jvmarchive, "_dump_classes", lambda partial, scratch: partial.write_bytes(b"c" * size))
    assert jvmarchive.main([]) == 0
    archive = jvmarchive.existing()
    assert archive is not None and jvmarchive.record_path(archive).is_file()
    if used_at is not None:
        os.utime(jvmarchive.record_path(archive), (used_at, used_at))
    return archive


def test_making_an_archive_removes_those_of_spark_installations_that_are_gone(homes, tmp_path, monkeypatch, capsys):
    """A series of fresh clones, each with its virtual environment and archive: a clone deleted
    takes its environment along, and the next archive made removes the one it left."""
    spark, java, cache = homes
    gone, kept = environment(tmp_path, "clone-1-venv"), environment(tmp_path, "clone-2-venv")
    old = made(monkeypatch, gone)
    other = made(monkeypatch, kept)
    shutil.rmtree(gone)
    capsys.readouterr()
    mine = made(monkeypatch, spark)
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [other.name, jvmarchive.record_path(other).name, mine.name, jvmarchive.record_path(mine).name])
    assert f"removed {old}: its Spark installation {gone} is gone" in capsys.readouterr().err
    record = json.loads(jvmarchive.record_path(mine).read_text())
    assert record["spark_home"] == str(spark) and record["java_home"] == str(java)
    assert record["environment"] == sys.prefix


def test_archives_no_jvm_maps_any_more_go_and_a_build_under_way_keeps_its_file(homes, tmp_path, monkeypatch):
    spark, java, cache = homes
    other = environment(tmp_path, "other-venv")
    changed = made(monkeypatch, other)
    mine = made(monkeypatch, spark)
    (other / "jars" / "spark-sql.jar").write_bytes(b"a new jar: that archive no longer fits")
    legacy_mine = cache / f"{jvmarchive.PREFIX}{mine.name.split('-')[2]}-0123456789abcdef{jvmarchive.SUFFIX}"
    legacy_other = cache / f"{jvmarchive.PREFIX}0badcafe-0123456789abcdef{jvmarchive.SUFFIX}"
    for p in (legacy_mine, legacy_other):  # made before archives had records
        p.write_bytes(b"old")
    orphan = cache / f"{jvmarchive.PREFIX}deadbeef-0123456789abcdef{jvmarchive.RECORD_SUFFIX}"
    orphan.write_text("{}")
    ended = subprocess.Popen(["true"])  # a build's process that died: its pid is no process now
    ended.wait()
    dead = cache / f".{mine.name}.{ended.pid}{jvmarchive.PARTIAL_SUFFIX}"
    dead.write_bytes(b"half")
    alive = cache / f".{mine.name}.{os.getpid()}{jvmarchive.PARTIAL_SUFFIX}"
    alive.write_bytes(b"being written")
    removed = dict(jvmarchive.prune(mine))
    assert removed[changed] == f"made for other jars or another JDK than {other} has now"
    assert removed[legacy_mine] == "made for other jars or another JDK of this Spark installation"
    assert removed[orphan] == "a record without its archive" and removed[dead] == "a build that did not finish"
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [mine.name, jvmarchive.record_path(mine).name, legacy_other.name, alive.name])
    assert jvmarchive.prune(mine) == []  # nothing left to do: no error


def test_the_cache_stays_under_its_cap_least_recently_used_first_and_keeps_this_environments(
        homes, tmp_path, monkeypatch):
    spark, java, cache = homes
    monkeypatch.setenv("FUNKE_CACHE_MAX_MB", "3")
    archives = {name: made(monkeypatch, environment(tmp_path, name), MiB, used_at=at)
                for name, at in (("a", 1000.0), ("b", 4000.0), ("c", 2000.0), ("d", 3000.0))}
    # as d's was made, the four were 4 MiB: a's, the least recently used, went
    assert sorted(p.name for p in cache.glob("*.jsa")) == sorted(archives[n].name for n in "bcd")
    jvmarchive.used(archives["c"])  # a TaskManager started from c's: now the most recently used
    mine = made(monkeypatch, spark, MiB)
    assert sorted(p.name for p in cache.glob("*.jsa")) == sorted([mine.name, archives["b"].name, archives["c"].name])
    monkeypatch.setenv("FUNKE_CACHE_MAX_MB", "0")  # this environment's archive alone, however large
    assert sorted(p for p, _ in jvmarchive.prune(mine)) == sorted([archives["b"], archives["c"]])
    assert sorted(p.name for p in cache.iterdir()) == sorted([mine.name, jvmarchive.record_path(mine).name])


@pytest.mark.parametrize("value", ["-1", "1.5", "lots", "２"])
def test_a_cap_that_is_not_a_whole_number_of_mib_is_refused_before_any_archive_is_made(homes, monkeypatch, capsys,
                                                                                       value):
    monkeypatch.setenv("FUNKE_CACHE_MAX_MB", value)
    monkeypatch.setattr(jvmarchive, "_dump_classes", lambda partial, scratch: pytest.fail("an archive was made"))
    assert jvmarchive.main([]) == 2
    assert "FUNKE_CACHE_MAX_MB must be a whole number of MiB (0 or more)" in capsys.readouterr().err


def test_a_taskmanager_starting_from_an_archive_marks_it_used_and_records_one_made_before_records(homes):
    spark, java, cache = homes
    archive = jvmarchive.path()
    cache.mkdir()
    archive.write_bytes(b"made by an earlier funke: no record")
    jvmarchive.used(archive)
    record = json.loads(jvmarchive.record_path(archive).read_text())
    assert record["spark_home"] == str(spark) and record["java_home"] == str(java)
    os.utime(jvmarchive.record_path(archive), (1000.0, 1000.0))
    jvmarchive.used(archive)
    assert jvmarchive.record_path(archive).stat().st_mtime > 1000.0
    assert jvmarchive.prune(archive, limit=0) == []  # its environment is there, and it is this one's


def test_the_cache_is_listed_and_cleared_from_the_command_line(homes, tmp_path, monkeypatch, capsys):
    spark, java, cache = homes
    mine = made(monkeypatch, spark)
    other = made(monkeypatch, environment(tmp_path, "other-venv"))
    capsys.readouterr()
    assert jvmarchive.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert str(cache) in listed and str(mine) in listed and str(other) in listed and f"Spark {spark}," in listed
    assert jvmarchive.main(["--clear"]) == 0
    assert list(cache.iterdir()) == []
