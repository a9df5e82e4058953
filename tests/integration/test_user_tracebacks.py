"""A user function that raises in a task shows, in `funke status`, its own file, line, function
name and source line, whatever its form: a KeyedProcessFunction subclass's instance, a plain
function given to process(), a bound method, a lambda, a nested function, a reduce fold, a
foreach_batch function, and a helper any of them calls. The job file is submitted with
`funke submit` as a user would; the TaskManagers (and Spark's Python workers) have no such file:
what they show comes with the pickled code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.conftest import Cluster

pytestmark = pytest.mark.cluster

JOB = '''\
"""Each form of user function, raising: build(["<form>"]) makes the job of one."""

from funke.common.api.dsl import ExecutionEnvironment
from funke.common.api.state import KeyedProcessFunction


class Sessions(KeyedProcessFunction):
    def process(self, key, rows, ctx):
        raise ValueError(f"class instance: key {key}")  # marker: class instance


def boom(key, rows, ctx):
    raise ValueError(f"process function: key {key}")  # marker: process function


class Parser:
    def parse(self, value):
        return check(value)  # marker: bound method


def check(value):
    raise ValueError(f"helper of a bound method: {value}")  # marker: helper


def nested_maker():
    def nested(value):
        raise ValueError(f"nested function: {value}")  # marker: nested function
    return nested


def fold(a, b):
    raise ValueError("reduce fold")  # marker: reduce fold


def sink(df, batch_id):
    raise ValueError(f"foreach_batch: batch {batch_id}")  # marker: foreach_batch


def build(args):
    form = args[0]
    env = ExecutionEnvironment(form, parallelism=1)
    env.set_restart_strategy("none")
    if form in ("class instance", "process function", "foreach_batch"):
        env.set_trigger("200 ms")
        stream = env.read_stream.rate(20).select("value % 3 AS k", "value")
        if form == "class instance":
            stream.key_by("k").process(Sessions(), schema="k bigint").discard()
        elif form == "process function":
            stream.key_by("k").process(boom, schema="k bigint").discard()
        else:
            stream.foreach_batch(sink)
    elif form == "bound method":
        env.from_range(5).map(Parser().parse, schema="v bigint").discard()
    elif form == "lambda":
        env.from_range(5).filter(
            lambda value: value // (value - value) > 0  # marker: lambda
        ).discard()
    elif form == "nested function":
        env.from_range(5).flat_map(nested_maker(), schema="v bigint").discard()
    elif form == "reduce fold":
        env.from_range(6).select("id % 2 AS k", "id AS v").key_by("k").reduce(fold).discard()
    return env
'''

# form -> the frames its traceback must end with: (marker of the line, function name), outermost first
FORMS = {
    "class instance": [("class instance", "process")],
    "process function": [("process function", "boom")],
    "bound method": [("bound method", "parse"), ("helper", "check")],
    "lambda": [("lambda", "<lambda>")],
    "nested function": [("nested function", "nested")],
    "reduce fold": [("reduce fold", "fold")],
    "foreach_batch": [("foreach_batch", "sink")],
}


def line_of(marker: str) -> tuple[int, str]:
    """(line number, source line stripped) of the job file's line marked `marker`."""
    for number, line in enumerate(JOB.splitlines(), start=1):
        if line.endswith(f"# marker: {marker}"):
            return number, line.strip()
    raise AssertionError(f"no line marked {marker!r}")


def test_every_form_of_user_function_shows_its_file_line_and_name_in_funke_status(spark_cluster: Cluster,
                                                                                   tmp_path: Path):
    job_file = tmp_path / "user_job.py"
    job_file.write_text(JOB)
    jobs = {}
    for form in FORMS:  # all submitted at once; those without a slot yet wait for one
        jobs[form] = spark_cluster.funke("submit", "--detach", str(job_file), "--", form).stdout.strip()
    job_file.unlink()  # what the tracebacks show of it came with the pickled code
    printed, wrong = {}, []
    for form, job_id in jobs.items():
        watched = spark_cluster.funke("watch", job_id, check=False, timeout=300)
        assert watched.returncode == 1, f"{form}: {watched.stdout}{watched.stderr}"
        status = spark_cluster.funke("status", job_id).stdout
        assert re.search(rf"job {job_id}  '{form}'  FAILED", status) and "\nfailure:\n" in status, status
        failure = status[status.index("\nfailure:\n") + 1:].split("\nexception history")[0]
        printed[form] = failure
        frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s+(.+)', failure)
        shown = [(int(line), name, source) for path, line, name, source in frames if path == str(job_file)]
        expected = []
        for marker, name in FORMS[form]:
            number, source = line_of(marker)
            expected.append((number, name, source))
        if "<dynamic-code>" in status or shown[-len(expected):] != expected:
            wrong.append(f"{form}: expected the frames {expected} of {job_file}, got:\n{failure}")
    print("\n\n".join(f"== {form}\n{text}" for form, text in printed.items()))
    assert not wrong, "\n".join(wrong)
