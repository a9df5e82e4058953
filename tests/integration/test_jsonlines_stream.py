"""The JSON-lines source on a real cluster (a JobManager and three TaskManagers with PySpark):
lines appended to existing files and new files are each read once, by byte offsets per file in
the offset log, and a file sink's committed batches hold every complete line exactly once."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from funke.common.streaming.sources.jsonlines import JsonLinesSource
from funke.jobmanager import streamsinks
from funke.jobmanager.checkpointstore import CheckpointStore
from tests.integration.conftest import funke  # noqa: F401

pytestmark = pytest.mark.cluster


@pytest.fixture
def stream_cluster(streaming_cluster):
    streaming_cluster.restore()
    yield streaming_cluster


JSON_LINES_JOB = '''
from funke.common.api.dsl import ExecutionEnvironment


def build(args):
    incoming, checkpoint, out = args
    env = ExecutionEnvironment("json lines", parallelism=2)
    env.read_stream.json_lines(incoming, "n int, word string").write_parquet(out, mode="overwrite")
    env.set_trigger(available_now=True)
    env.set_checkpoint_location(checkpoint)
    return env
'''


def committed(target: Path) -> dict[int, list[tuple[int, str]]]:
    out = {}
    for b in streamsinks.committed_batches(str(target)):
        rows = []
        for name in streamsinks.committed_files(str(target), b):
            t = pq.read_table(target / name)
            rows += list(zip(t.column("n").to_pylist(), t.column("word").to_pylist()))
        out[b] = rows
    return out


def lines(*pairs: tuple[int, str]) -> bytes:
    return b"".join(json.dumps({"n": n, "word": w}).encode() + b"\n" for n, w in pairs)


def test_appended_lines_and_new_files_are_read_once_by_their_logged_byte_offsets(stream_cluster, tmp_path):
    incoming, checkpoint, out, job_file = tmp_path / "in", tmp_path / "ck", tmp_path / "out", tmp_path / "job.py"
    incoming.mkdir()
    job_file.write_text(JSON_LINES_JOB)
    (incoming / "a.jsonl").write_bytes(lines((1, "one"), (2, "two")) + b'{"n": 3, "wo')  # a line being written
    (incoming / "b.jsonl").write_bytes(lines((4, "four")))
    args = ("--", str(incoming), str(checkpoint), str(out))
    first = stream_cluster.funke("submit", str(job_file), *args, check=False)
    assert first.returncode == 0, first.stdout + first.stderr

    # the line finished, lines appended, a new file
    with open(incoming / "a.jsonl", "ab") as f:
        f.write(b'rd": "three"}\n' + lines((5, "five")))
    (incoming / "c.jsonl").write_bytes(lines((6, "six")))
    second = stream_cluster.funke("submit", str(job_file), *args, check=False)
    assert second.returncode == 0, second.stdout + second.stderr

    batches = committed(out)
    assert sorted(batches) == [0, 1]
    assert sorted(batches[0]) == [(1, "one"), (2, "two"), (4, "four")]
    assert sorted(batches[1]) == [(3, "three"), (5, "five"), (6, "six")]

    # the offset log names byte offsets per file that end lines; each batch's range reads its rows again
    store = CheckpointStore(str(checkpoint))
    ranges = [next(iter(store.read_offsets(b).sources.values())) for b in store.offset_ids()]
    a_size = (incoming / "a.jsonl").stat().st_size
    assert ranges[0].end == {"a.jsonl": len(lines((1, "one"), (2, "two"))), "b.jsonl": len(lines((4, "four")))}
    assert ranges[1].start == ranges[0].end
    assert ranges[1].end == {"a.jsonl": a_size, "b.jsonl": len(lines((4, "four"))), "c.jsonl": len(lines((6, "six")))}
    replayed = [sorted(json.loads(line)["n"] for s in JsonLinesSource.slices(r)
                       for line in (incoming / s.name).read_bytes()[s.begin:s.end].splitlines()) for r in ranges]
    assert replayed == [[1, 2, 4], [3, 5, 6]]
