"""Which class-data archive a TaskManager's Spark JVM maps: one per JVM build and set of Spark
jars, in funke's cache directory, and none where it was not made (pure file look-ups; making an
archive starts a JVM and is left to `python -m funke.taskmanager.jvmarchive`)."""

from __future__ import annotations

import os
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
