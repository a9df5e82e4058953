"""The class-data archive of the TaskManagers' Spark JVM, made for real (a JVM starts a session,
runs the warm-up and writes the archive at its exit) into a cache directory of the test's own
(the user's is never touched), the archive of an environment that is gone removed as it is made,
and a TaskManager's session started from it: the JVM maps it, and runs a job even after the
archive was removed under it (the mapping holds the file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_archive_is_made_once_and_a_taskmanagers_session_starts_from_it(tmp_path):
    env = dict(os.environ, FUNKE_CACHE_DIR=str(tmp_path / "cache"))
    # what a fresh clone deleted since left: an archive whose Spark installation (its venv) is gone
    (tmp_path / "cache").mkdir()
    gone = tmp_path / "cache" / "spark-cds-0badcafe-0123456789abcdef.jsa"
    gone.write_bytes(b"an archive of a deleted clone's environment")
    gone.with_suffix(".json").write_text(json.dumps({
        "spark_home": str(tmp_path / "deleted-clone" / ".venv" / "pyspark"), "java_home": "/usr/lib/jvm/gone",
        "environment": str(tmp_path / "deleted-clone" / ".venv")}))
    made = subprocess.run([sys.executable, "-m", "funke.taskmanager.jvmarchive"], env=env, capture_output=True,
                          text=True, timeout=600, cwd=REPO)
    assert made.returncode == 0, made.stderr[-3000:]
    archives = sorted((tmp_path / "cache").glob("*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 10 * 2**20, archives
    assert str(archives[0]) in made.stdout and f"removed {gone}: its Spark installation" in made.stderr
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [archives[0].name,
                                                                     archives[0].with_suffix(".json").name]
    # there now: said so, and not made again
    again = subprocess.run([sys.executable, "-m", "funke.taskmanager.jvmarchive", "--check"], env=env,
                           capture_output=True, text=True, timeout=60, cwd=REPO)
    assert again.returncode == 0 and again.stdout.strip() == str(archives[0])

    # A session planned as a TaskManager plans it maps the archive (-Xshare:on would refuse to
    # start if it could not) and runs a job with a Python function, also once the archive was
    # removed (as a prune removes it): the JVM's mapping keeps the file's pages.
    probe = textwrap.dedent(f"""
        import os, sys
        from funke.taskmanager import jvmarchive, sparksession
        archive = jvmarchive.existing()
        assert archive is not None
        for sub in ("spark", "jvm"):
            os.makedirs(os.path.join({str(tmp_path / "scratch")!r}, sub), exist_ok=True)
        plan = sparksession.plan(master=None, remote=None, slots=2, cores=2, scratch={str(tmp_path / "scratch")!r},
                                 user_conf=(("spark.driver.extraJavaOptions", "-Xshare:on"),), environ=os.environ,
                                 python=sys.executable, jvm_archive=jvmarchive.java_option(archive))
        os.environ.update(plan.environ)
        from pyspark.sql import SparkSession
        builder = SparkSession.builder.master(plan.target)
        for k, v in plan.conf.items():
            builder = builder.config(k, v)
        spark = builder.getOrCreate()
        jvm = spark.sparkContext._gateway.proc.pid
        def maps():
            with open(f"/proc/{{jvm}}/maps") as f:
                return [line.split(None, 5)[-1].strip() for line in f if str(archive) in line]
        assert maps() and all(m == str(archive) for m in maps()), maps()
        archive.unlink()
        jvmarchive.record_path(archive).unlink()
        assert maps() and all(m == f"{{archive}} (deleted)" for m in maps()), maps()
        print("MAPPED", len(maps()))
        def plus_one(batches):
            for b in batches:
                yield b
        rows = spark.range(0, 100, 1, 2).mapInArrow(plus_one, "id long").groupBy().sum("id").collect()
        print("SUM", rows[0][0])
        spark.stop()
    """)
    ran = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "SUM 4950" in ran.stdout and "MAPPED" in ran.stdout
