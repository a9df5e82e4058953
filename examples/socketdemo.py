"""`python3 deploy/dev.py socket`: the seed's socket word count on a fresh local cluster, fed by a
line server of its own, checked batch by batch.

Owns the demo's script: start a multi-process cluster (one JobManager, 2 TaskManagers x 2 slots)
in `.funke/socket-<timestamp>/`, serve the lines of examples/data/ on a loopback port
(`funke.deploy.lineserver`), submit `examples/socket_wordcount.py` against it (2 s batches, the
counts as CSV), print each batch's progress as `funke watch` does, and once every line was
received stop the query gracefully (`funke stop`). It prints every committed batch with its
blocks and top words, whether each batch's counts equal a direct count of the lines of exactly
the blocks its offset log entry allocated it, `funke progress`, and the job's status history.
The cluster is stopped whatever happens; its directory stays for inspection.

Exit code 0 only if the job FINISHED, every line was counted once, and every batch matches.

A demo runner, not an example of a job: besides the public API (`funke.client`) it uses funke's
inside (the local cluster launcher, the CLI's renderers, the checkpoint's offset log, the receiver's blocks and the sink's manifests) to check what it shows. A job
file imports only `funke`, `funke.state` and `funke.client`.
"""

from __future__ import annotations

import collections
import csv
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from funke.client import JobManagerClient, job_status_name, load_job_file
from funke.common.streaming.sources import ReceiverSource, receiver_blocks_dir, stored_blocks
from funke.deploy import localcluster
from funke.deploy.lineserver import LineServer
from funke.jobmanager import streamsinks
from funke.jobmanager.checkpointstore import CheckpointStore

from examples.streamdemo import _say, _watch, run_demo, say_progress_and_history, stop_query

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "socket_wordcount.py"
CORPUS = ROOT / "examples" / "data"
LINES_PER_SECOND = 40
TOP = 3


def corpus_lines() -> list[str]:
    return [line for f in sorted(CORPUS.glob("*.txt")) for line in f.read_text(encoding="utf-8").splitlines() if line]


def block_lines(checkpoint: Path, source: str, batch: int) -> tuple[int, list[str]]:
    """(how many blocks, their lines) allocated to a batch by its offset log entry."""
    entry = CheckpointStore(str(checkpoint)).read_offsets(batch).sources[source]
    directory = receiver_blocks_dir(str(checkpoint), source, 0)
    stored = stored_blocks(os.listdir(directory)) if os.path.isdir(directory) else {}
    blocks = ReceiverSource(1).blocks(entry, 0)
    lines = [line for seq in blocks for line in (Path(directory) / stored[seq]).read_text(encoding="utf-8").splitlines()]
    return len(blocks), lines


def run(root: Path, cluster: localcluster.ClusterInfo) -> int:
    out, checkpoint = root / "counts", root / "checkpoint"
    lines = corpus_lines()
    server = LineServer(lines, LINES_PER_SECOND)
    try:
        job = load_job_file(EXAMPLE, ["--host", "127.0.0.1", "--port", str(server.port), "--output", str(out),
                                      "--checkpoint", str(checkpoint)])
        with JobManagerClient(cluster.address, credentials=localcluster.credentials(cluster.dir)) as client:
            job_id = client.submit(job)
            _say(f"submitted job {job_id} {job.name!r}: a batch every 2 s of the lines a receiver reads from "
                 f"127.0.0.1:{server.port}, where {len(lines)} lines are served, {LINES_PER_SECOND} a second")
            stop = threading.Event()
            watcher = threading.Thread(target=_watch, args=(client, job_id, stop), daemon=True)
            watcher.start()
            deadline = time.monotonic() + len(lines) / LINES_PER_SECOND + 180
            while time.monotonic() < deadline:
                if server.done and sum(p["numInputRows"] for p in client.progress(job_id)) >= len(lines):
                    break
                time.sleep(0.5)
            details, records = stop_query(client, job_id, "every line received and counted", stop)
    finally:
        server.close()
    status = job_status_name(details.status)
    source = next(v.id for v in details.vertices if v.name.startswith("Source: socket"))
    _say()
    _say(f"{len(streamsinks.committed_batches(str(out)))} committed batches in {out}:")
    all_match, received = True, []
    for batch in streamsinks.committed_batches(str(out)):
        rows: list[tuple[str, int]] = []
        for name in streamsinks.committed_files(str(out), batch):
            with open(out / name, newline="") as f:
                rows += [(r["word"], int(r["n"])) for r in csv.DictReader(f)]
        blocks, allocated = block_lines(checkpoint, source, batch)
        received += allocated
        expected = collections.Counter(w for line in allocated for w in line.split(" "))
        match = dict(rows) == dict(expected) and len(rows) == len(expected)
        all_match &= match
        top = ", ".join(f"{w or repr(w)} {n}" for w, n in sorted(rows, key=lambda r: (-r[1], r[0]))[:TOP])
        _say(f"  batch {batch}: {blocks} blocks, {len(allocated)} lines, {sum(n for _, n in rows)} words; top: "
             f"{top}  [{'matches' if match else 'DIFFERS FROM'} a direct count of its blocks' lines]")
    every_line = received == lines
    _say(f"every line counted exactly once, in order: {'yes' if every_line else 'NO'}; every batch equals a direct "
         f"count of its blocks: {'yes' if all_match else 'NO'}")
    say_progress_and_history(job_id, records, details)
    return 0 if status == "FINISHED" and all_match and every_line else 1


def main(argv: Sequence[str] | None = None) -> int:
    return run_demo("socket", argv, run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
