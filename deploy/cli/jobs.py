"""The job commands: submit, list, status, watch, cancel, stop, progress, result, conformance;
and how they find the JobManager (--jobmanager, $FUNKE_JOBMANAGER, the local cluster's address
file or its HA leader, else 127.0.0.1:6123)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from funke.deploy import clusterdir
from funke.deploy.cli.exitcodes import EXIT_INTERRUPTED, EXIT_OK, EXIT_UNSUCCESSFUL, EXIT_USAGE, UsageError, print_error
from funke.deploy.cli.live import follow_job
from funke.deploy.cli.render import (
    print_json,
    render_event,
    render_job_details,
    render_outcome,
    render_progress,
    render_rows,
    render_summary_table,
    seconds_of,
    to_dict,
)
from funke.deploy.client import (
    DEFAULT_JOBMANAGER,
    ClientCredentials,
    JobManagerClient,
    JobManagerConnectionLost,
    JobManagerUnavailable,
    job_status_name,
    rescale_pause,
)
from funke.deploy.jobfile import load_job_file
from funke.runtime.security import default_cluster_dir

if TYPE_CHECKING:
    from funke.common.graph.jobgraph import JobGraph


def resolve_jobmanager(explicit: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The JobManager address: `explicit` (--jobmanager), else $FUNKE_JOBMANAGER, else the local
    cluster's address file, else 127.0.0.1:6123."""
    environ = os.environ if environ is None else environ
    if explicit:
        return _checked_address(explicit, "--jobmanager")
    if environ.get("FUNKE_JOBMANAGER"):
        return _checked_address(environ["FUNKE_JOBMANAGER"], "FUNKE_JOBMANAGER")
    recorded = clusterdir.read_address(default_cluster_dir(environ))
    return recorded or DEFAULT_JOBMANAGER


def _checked_address(address: str, origin: str) -> str:
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{origin}: expected HOST:PORT, e.g. 127.0.0.1:6123, got {address!r}")
    return address.strip()


def client_for(args: argparse.Namespace) -> JobManagerClient:
    address = resolve_jobmanager(args.jobmanager)
    credentials = ClientCredentials.discover(token_file=args.token_file, tls_ca=args.tls_ca,
                                             tls_cert=args.tls_cert, tls_key=args.tls_key)
    if not args.jobmanager and not os.environ.get("FUNKE_JOBMANAGER"):
        root = default_cluster_dir()
        if clusterdir.ha_services(root) is not None:
            # A high-availability cluster: follow its leader through failovers.
            return JobManagerClient(address, leader=lambda: clusterdir.read_address(root), credentials=credentials)
    return JobManagerClient(address, credentials=credentials)


def collect_sinks(job: JobGraph) -> list[str]:
    """Ids of the vertices that end in a collect sink."""
    return [v.id for v in job.vertices if v.operators and v.operators[-1].kind == "sink.collect"]


_SUBMIT_FLAGS = {"--detach": "detach", "--json": "json"}


def split_submit_args(args: argparse.Namespace, after_dashes: list[str]) -> None:
    """Our own flags may also follow the job file (`funke submit job.py --parallelism 4 --json`);
    everything else there, and everything after `--`, belongs to the job."""
    job_args: list[str] = []
    rest = list(args.job_args)
    while rest:
        token = rest.pop(0)
        if token in _SUBMIT_FLAGS:
            setattr(args, _SUBMIT_FLAGS[token], True)
        elif token == "--jobmanager":
            if not rest:
                raise UsageError("--jobmanager needs HOST:PORT")
            args.jobmanager = rest.pop(0)
        elif token.startswith("--jobmanager="):
            args.jobmanager = token.partition("=")[2]
        else:
            job_args.append(token)
    args.job_args = job_args + after_dashes


def cmd_submit(args: argparse.Namespace) -> int:
    job = load_job_file(args.file, args.job_args)
    with client_for(args) as client:
        job_id = client.submit(job)
        if args.detach:
            if args.json:
                print_json({"job_id": job_id, "name": job.name})
            else:
                print(job_id, flush=True)  # alone on its line: JOB=$(funke submit --detach ...)
            return EXIT_OK
        out = sys.stdout
        if not args.json:
            print(f"submitted job {job_id} {job.name!r} to {client.address}", flush=True)
        try:
            progress = follow_job(client, job_id, out, tty=out.isatty(), quiet=args.json)
        except KeyboardInterrupt:
            print_error(f"stopped following job {job_id}; it keeps running: `funke status {job_id}`, "
                   f"`funke cancel {job_id}`")
            return EXIT_INTERRUPTED
        try:
            details = client.get_job(job_id)
            status = job_status_name(details.status)
            columns: list[str] = []
            rows: list[dict[str, Any]] | None = None
            collects = collect_sinks(job)
            if status == "FINISHED" and len(collects) == 1:
                _, table = client.result_table(job_id, collects[0])
                columns, rows = table.column_names, table.to_pylist()
        except JobManagerUnavailable as exc:  # it answered a moment ago: it went away
            raise JobManagerConnectionLost(client.address, job_id, exc.details, progress.status, exc.code) from None
    if args.json:
        document: dict[str, Any] = {
            "job_id": job_id,
            "name": details.name,
            "status": status,
            "status_history": [to_dict(t) for t in details.status_history],
            "created_at": details.created_at.ToJsonString() if seconds_of(details.created_at) else None,
            "failure": to_dict(details.failure) if details.HasField("failure") else None,
        }
        if rows is not None:
            document["rows"] = rows
        print_json(document)
    else:
        print("\n".join(render_outcome(details, columns, rows)), flush=True)
    return EXIT_OK if status == "FINISHED" else EXIT_UNSUCCESSFUL


def cmd_list(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        jobs = client.list_jobs()
    if args.json:
        print_json({"jobs": [to_dict(j) for j in jobs]})
    else:
        print(render_summary_table(jobs, time.time()))
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        details = client.get_job(args.job)
    if args.json:
        print_json(to_dict(details))
    else:
        print(render_job_details(details))
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    final = ""
    with client_for(args) as client:
        for event in client.watch(args.job):
            kind = event.WhichOneof("event")
            if kind == "snapshot":
                final = job_status_name(event.snapshot.status)
            elif kind == "job_status":
                final = job_status_name(event.job_status.to_status)
            if args.json:
                print_json(to_dict(event))
            else:
                print("\n".join(render_event(event)), flush=True)
    return EXIT_OK if final == "FINISHED" else EXIT_UNSUCCESSFUL


def cmd_cancel(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        status = client.cancel(args.job)
    if args.json:
        print_json({"job_id": args.job, "status": status})
    else:
        print(f"job {args.job} is {status}")
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        status, message = client.stop(args.job, drain=args.drain, timeout_s=args.timeout)
        if args.detach:
            if args.json:
                print_json({"job_id": args.job, "status": status, "message": message})
            else:
                print(f"job {args.job} is {status}: {message}")
            return EXIT_OK
        if not args.json:
            print(f"job {args.job}: {message}", flush=True)
            print("following it until it ends: exit 0 if it ends FINISHED, 1 if it is cancelled (CANCELED) or fails",
                  flush=True)
        final = status
        for event in client.watch(args.job):  # until the job ends: FINISHED, or CANCELED on timeout
            kind = event.WhichOneof("event")
            if kind == "snapshot":
                final = job_status_name(event.snapshot.status)
            elif kind == "job_status":
                final = job_status_name(event.job_status.to_status)
                if not args.json:
                    print("\n".join(render_event(event)), flush=True)
    if args.json:
        print_json({"job_id": args.job, "status": final, "message": message})
    else:
        print(f"job {args.job} is {final}")
    return EXIT_OK if final == "FINISHED" else EXIT_UNSUCCESSFUL


def cmd_rescale(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        answer = client.rescale(args.job, args.parallelism, args.vertex, args.timeout)
        out: dict = {"job_id": args.job, "message": answer.message, "parallelism": dict(answer.parallelism),
                     "last_batch_id": answer.last_batch_id}
        if not args.json:
            print(f"job {args.job}: {answer.message}", flush=True)
        if args.detach or "nothing changes" in answer.message:
            if args.json:
                print_json(out)
            return EXIT_OK
        deadline = time.monotonic() + args.timeout + 120
        pause = None
        while pause is None and time.monotonic() < deadline:
            time.sleep(0.1)
            pause = rescale_pause(client.progress(args.job), answer.last_batch_id)
    if pause is None:
        message = f"no batch committed at the new parallelism within {args.timeout + 120:g} s; see funke status {args.job}"
        if args.json:
            print_json({**out, "error": message})
        else:
            print(message, file=sys.stderr)
        return EXIT_UNSUCCESSFUL
    out.update(pause)
    if args.json:
        print_json(out)
    else:
        shown = f"{pause['pause_ms'] / 1000:.3f} s" if pause["pause_ms"] is not None else "unknown"
        print(f"job {args.job} runs at {', '.join(f'{v} {p}' for v, p in sorted(answer.parallelism.items()))}: "
              f"batch {pause['last_batch_before']} was the last committed before, batch {pause['first_batch_after']} "
              f"the first after; pause {shown}")
    return EXIT_OK


def cmd_progress(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        records = client.progress(args.job)
    if args.json:
        print_json(records)
    else:
        print("\n".join(render_progress(records)))
    return EXIT_OK


def cmd_conformance(args: argparse.Namespace) -> int:
    from funke.deploy import conformance

    if args.list:
        for s in conformance.SCENARIOS:
            print(f"{s.name:26} {s.about}{' (--destructive)' if s.destructive else ''}\n{'':26} expected: {s.expected}")
        return EXIT_OK
    with client_for(args) as client:
        report = None if args.json else (lambda o: print(
            f"{o.name}: {'pass' if o.passed else 'FAIL'} ({o.observed}, {o.seconds:.1f} s)", flush=True))
        try:
            outcomes = conformance.run_scenarios(client, args.only, report=report, destructive=args.destructive,
                                                 kill_command=args.kill_command or "",
                                                 restore_command=args.restore_command or "")
        except ValueError as exc:
            print_error(str(exc))
            return EXIT_USAGE
    if args.junit:
        Path(args.junit).write_text(conformance.junit(outcomes))
    if args.json:
        print_json(conformance.as_json(outcomes))
    else:
        print()
        print(conformance.table(outcomes))
        passed = sum(o.passed for o in outcomes)
        print(f"\n{passed} of {len(outcomes)} scenario(s) passed in {sum(o.seconds for o in outcomes):.1f} s")
    return EXIT_OK if all(o.passed for o in outcomes) else EXIT_UNSUCCESSFUL


def cmd_state(args: argparse.Namespace) -> int:
    if (args.job is None) == (args.checkpoint is None):
        raise UsageError("funke state reads a running query's state (JOB) or a checkpoint's (--checkpoint PATH): "
                         "give one of them")
    if args.batch is not None and args.checkpoint is None:
        raise UsageError("--batch reads the state after an earlier batch from the checkpoint: give --checkpoint PATH "
                         "(a running query's is read after its last committed batch)")
    if args.checkpoint is not None:
        return _checkpoint_state(args)
    with client_for(args) as client:
        reply, table = client.keyed_state(args.job, args.operator or "", args.key, args.limit)
    return _print_state(args, {"job_id": args.job}, reply.vertex_id, reply.batch_id, table, reply.matching_keys)


def _checkpoint_state(args: argparse.Namespace) -> int:
    """`funke state --checkpoint PATH`: read in this process, from the checkpoint's files alone."""
    from funke.common.streaming.state import MissingState
    from funke.jobmanager.streaming.state import DEFAULT_STATE_ROWS, MAX_STATE_ROWS, NoSuchState, checkpoint_state

    problems = []
    if not 0 <= args.limit <= MAX_STATE_ROWS:
        problems.append(f"--limit {args.limit} is outside [0, {MAX_STATE_ROWS}] (0: {DEFAULT_STATE_ROWS})")
    if args.batch is not None and args.batch < 0:
        problems.append(f"--batch {args.batch}: a batch id is not negative")
    if any(len(k) > 4096 for k in args.key):
        problems.append("a --key value is longer than 4096 characters")
    if problems:
        raise UsageError("; ".join(problems))
    try:
        found = checkpoint_state(args.checkpoint, args.operator or "", args.batch, tuple(args.key),
                                 args.limit or DEFAULT_STATE_ROWS)
    except NoSuchState as exc:
        raise UsageError(str(exc)) from None
    except (MissingState, OSError, ValueError) as exc:  # the state is there, and lost to us
        print_error(f"the keyed state in {args.checkpoint} cannot be read: {type(exc).__name__}: {exc}")
        return EXIT_UNSUCCESSFUL
    return _print_state(args, {"checkpoint": args.checkpoint}, found.vertex_id, found.batch_id, found.table,
                        found.matching)


def _print_state(args: argparse.Namespace, source: dict[str, Any], vertex_id: str, batch_id: int, table: Any,
                 matching: int) -> int:
    rows = table.to_pylist()
    if args.json:
        print_json({**source, "operator": vertex_id, "batch_id": batch_id, "matching_keys": matching,
                    "columns": table.column_names, "rows": rows})
        return EXIT_OK
    if batch_id < 0:
        print(f"{vertex_id}: no batch committed yet, so no state")
        return EXIT_OK
    print("\n".join(render_rows(table.column_names, rows, prefix="")))
    more = f" of {matching}" if matching > len(rows) else ""
    print(f"({len(rows)}{more} key(s) of {vertex_id}, after batch {batch_id})")
    return EXIT_OK


def cmd_result(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        vertex_id, table = client.result_table(args.job, args.vertex or "")
    rows = table.to_pylist()
    if args.json:
        print_json({"job_id": args.job, "vertex_id": vertex_id, "row_count": len(rows),
                     "columns": table.column_names, "rows": rows})
    else:
        print("\n".join(render_rows(table.column_names, rows, prefix="")))
        print(f"({len(rows)} row(s) from {vertex_id})")
    return EXIT_OK
