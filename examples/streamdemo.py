"""The README's streaming command (`python3 deploy/dev.py stream`): the streaming word count on a
fresh local cluster, fed file by file, checked batch by batch.

Owns the demo's script: start a multi-process cluster (one JobManager, 2 TaskManagers x 2 slots)
in `.funke/stream-<timestamp>/`, submit `examples/streaming_wordcount.py` (1 s trigger, at most
2 files per batch, counts as CSV), cut the corpus of examples/data/ into small files and move
them into the query's input directory one every 0.7 s while printing each batch's progress as
`funke watch` does, then stop the query gracefully (`funke stop`). It prints every committed
batch with its files and top words, whether each batch's counts equal a direct count of exactly
the files its offset log entry names, `funke progress` for the query, and the job's status
history. The cluster is stopped whatever happens; its directory stays for inspection.

Exit code 0 only if the job FINISHED, every file was counted, and every batch matches.

A demo runner, not an example of a job: besides the public API (`funke.client`) it uses funke's
inside (the local cluster launcher, the CLI's renderers, the checkpoint's offset log and the sink's manifests) to check what it shows. A job
file imports only `funke`, `funke.state` and `funke.client`.
"""

from __future__ import annotations

import csv
import datetime
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from funke.client import FunkeError, JobManagerClient, job_status_name, load_job_file
from funke.common.streaming.sources import FilesSource
from funke.deploy import localcluster
from funke.deploy.cli import render_event, render_history, render_progress
from funke.jobmanager import streamsinks
from funke.jobmanager.checkpointstore import CheckpointStore

from examples.demo import count_texts, tokeniser_and_input

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "streaming_wordcount.py"
CORPUS = ROOT / "examples" / "data"
TASKMANAGERS, SLOTS = 2, 2
PIECES_PER_FILE = 3  # the corpus's files are cut into this many pieces each
FEED_EVERY_S = 0.7
TOP = 3


def _say(message: str = "") -> None:
    print(message, flush=True)


def fresh_dir(prefix: str) -> Path:
    """`.funke/<prefix>-<timestamp>/` beside the checkout, not there yet."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = ROOT / ".funke" / f"{prefix}-{stamp}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def pieces() -> list[tuple[str, str]]:
    """(file name, text): each corpus file cut into pieces at line ends."""
    out = []
    for f in sorted(CORPUS.glob("*.txt")):
        lines = f.read_text(encoding="utf-8").splitlines(keepends=True)
        step = -(-len(lines) // PIECES_PER_FILE)
        for i in range(0, len(lines), step):
            out.append((f"{f.stem}-{i // step + 1}.txt", "".join(lines[i:i + step])))
    return out


def _watch(client: JobManagerClient, job_id: str, stop: threading.Event) -> None:
    """Print each batch's progress line as it completes."""
    try:
        for event in client.watch(job_id):
            if event.WhichOneof("event") == "streaming" and event.streaming.kind == "QueryProgress":
                _say("\n".join(render_event(event)))
            elif event.WhichOneof("event") == "job_status":
                _say("\n".join(render_event(event)))
            if stop.is_set():
                return
    except FunkeError:
        return


def run(root: Path, cluster: localcluster.ClusterInfo) -> int:
    incoming, out, checkpoint = root / "incoming", root / "counts", root / "checkpoint"
    incoming.mkdir(parents=True)
    job = load_job_file(EXAMPLE, ["--input", str(incoming), "--output", str(out), "--checkpoint", str(checkpoint)])
    words = tokeniser_and_input(job, "source.stream.text")[0]
    feed = pieces()
    with JobManagerClient(cluster.address, credentials=localcluster.credentials(cluster.dir)) as client:
        job_id = client.submit(job)
        _say(f"submitted job {job_id} {job.name!r}: a batch every 1 s, at most 2 files each, from {incoming}")
        stop = threading.Event()
        watcher = threading.Thread(target=_watch, args=(client, job_id, stop), daemon=True)
        watcher.start()
        _say(f"moving {len(feed)} files into {incoming.name}/, one every {FEED_EVERY_S} s ...")
        for name, text in feed:
            aside = incoming / f".{name}"
            aside.write_text(text, encoding="utf-8")
            aside.rename(incoming / name)  # a file appears whole
            time.sleep(FEED_EVERY_S)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            progress = client.progress(job_id)
            if progress and progress[-1]["sources"][0]["endOffset"] == len(feed):
                break
            time.sleep(0.5)
        details, records = stop_query(client, job_id, "every file taken", stop)
    status = job_status_name(details.status)
    texts = dict(feed)

    store = CheckpointStore(str(checkpoint))
    (source,) = [p.name for p in (checkpoint / "sources").iterdir()]
    seen = store.seen_files(source)
    _say()
    _say(f"{len(streamsinks.committed_batches(str(out)))} committed batches in {out}:")
    all_match, taken = True, []
    for batch in streamsinks.committed_batches(str(out)):
        rows: list[tuple[str, int]] = []
        for name in streamsinks.committed_files(str(out), batch):
            with open(out / name, newline="") as f:
                rows += [(r["word"], int(r["count"])) for r in csv.DictReader(f)]
        (source_range,) = store.read_offsets(batch).sources.values()
        files = FilesSource.files(source_range, seen)
        taken += files
        expected = count_texts([texts[f] for f in files], words)
        match = dict(rows) == dict(expected) and len(rows) == len(expected)
        all_match &= match
        top = ", ".join(f"{w} {n}" for w, n in sorted(rows, key=lambda r: (-r[1], r[0]))[:TOP])
        _say(f"  batch {batch}: {', '.join(files) or '(no files)'}: {sum(n for _, n in rows)} words; top: {top}"
             f"  [{'matches' if match else 'DIFFERS FROM'} a direct count of its files]")
    every_file = sorted(taken) == sorted(texts)
    _say(f"every file counted exactly once: {'yes' if every_file else 'NO'}; every batch equals a direct "
         f"count of its files: {'yes' if all_match else 'NO'}")
    say_progress_and_history(job_id, records, details)
    return 0 if status == "FINISHED" and all_match and every_file else 1


def stop_query(client: JobManagerClient, job_id: str, why: str, watching: threading.Event):
    """`funke stop` the query, wait until it ended (90 s at most), stop watching it; returns its
    details and progress records."""
    _say(f"{why}; stopping the query gracefully (funke stop {job_id}) ...")
    client.stop(job_id, timeout_s=60)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and job_status_name(client.get_job(job_id).status) == "RUNNING":
        time.sleep(0.2)
    watching.set()
    return client.get_job(job_id), client.progress(job_id)


def say_progress_and_history(job_id: str, records: list[dict], details) -> None:
    """A demo's ending: `funke progress` of the query, then the job's status history."""
    _say()
    _say(f"funke progress {job_id}:")
    _say("\n".join(render_progress(records)))
    _say()
    _say(f"job {job_id} {job_status_name(details.status)}")
    _say("\n".join(render_history(details)))


def run_demo(name: str, argv: Sequence[str] | None, run: Callable[[Path, localcluster.ClusterInfo], int]) -> int:
    """A streaming demo's frame: a fresh local cluster (1 JobManager, TASKMANAGERS x SLOTS) in
    `.funke/<name>-<timestamp>/`, `run(dir, cluster)`, the cluster stopped whatever happens."""
    if argv:
        print(f"funke {name} demo: takes no arguments, got {' '.join(argv)}", file=sys.stderr)
        return 2
    root = fresh_dir(name)
    _say(f"starting a local cluster: 1 JobManager and {TASKMANAGERS} TaskManagers x {SLOTS} slots "
         f"in {root.relative_to(ROOT)}/ ...")
    try:
        try:
            cluster = localcluster.start(localcluster.ClusterSpec(root, TASKMANAGERS, SLOTS))
        except localcluster.ClusterError as exc:
            print(f"funke {name} demo: the cluster did not start: {exc}", file=sys.stderr)
            return 1
        return run(root, cluster)
    except FunkeError as exc:
        print(f"funke {name} demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"funke {name} demo: interrupted", file=sys.stderr)
        return 130
    finally:
        localcluster.stop(root)
        _say(f"cluster stopped; its logs are in {root / 'log'}")


def main(argv: Sequence[str] | None = None) -> int:
    return run_demo("stream", argv, run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
