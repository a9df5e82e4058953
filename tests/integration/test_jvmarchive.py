"""The class-data archive of the TaskManagers' Spark JVM, made for real (a JVM starts a session,
runs the warm-up and writes the archive at its exit) into a cache directory of the test's own,
and a TaskManager's session started from it: the JVM maps it and runs a job."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_archive_is_made_once_and_a_taskmanagers_session_starts_from_it(tmp_path):
    env = dict(os.environ, FUNKE_CACHE_DIR=str(tmp_path / "cache"))
    made = subprocess.run([sys.executable, "-m", "funke.taskmanager.jvmarchive"], env=env, capture_output=True,
                          text=True, timeout=600, cwd=REPO)
    assert made.returncode == 0, made.stderr[-3000:]
    archives = list((tmp_path / "cache").iterdir())
    assert len(archives) == 1 and archives[0].name.endswith(".jsa") and archives[0].stat().st_size > 10 * 2**20
    assert str(archives[0]) in made.stdout
    # there now: said so, and not made again
    again = subprocess.run([sys.executable, "-m", "funke.taskmanager.jvmarchive", "--check"], env=env,
                           capture_output=True, text=True, timeout=60, cwd=REPO)
    assert again.returncode == 0 and again.stdout.strip() == str(archives[0])

    # A session planned as a TaskManager plans it maps the archive (-Xshare:on would refuse to
    # start if it could not) and runs a job with a Python function.
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
        def plus_one(batches):
            for b in batches:
                yield b
        rows = spark.range(0, 100, 1, 2).mapInArrow(plus_one, "id long").groupBy().sum("id").collect()
        print("SUM", rows[0][0])
        spark.stop()
    """)
    ran = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "SUM 4950" in ran.stdout
