"""The cluster commands: `funke cluster start|stop|status|secrets|kill|add-taskmanager|
add-jobmanager` on a local cluster's directory (`funke.deploy.localcluster` starts and stops,
`funke.deploy.clusterdir` reads), and `funke jobmanager|taskmanager` (one process, by hand)."""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from funke.deploy import clusterdir, localcluster
from funke.deploy.cli.exitcodes import EXIT_OK, EXIT_UNSUCCESSFUL, EXIT_USAGE, print_error
from funke.deploy.cli.render import print_json, table_lines, to_dict
from funke.runtime.security import default_cluster_dir


def cluster_dir(args: argparse.Namespace) -> Path:
    return Path(args.dir).expanduser().resolve() if args.dir else default_cluster_dir()


def cmd_cluster_start(args: argparse.Namespace) -> int:
    root = cluster_dir(args)
    print(f"starting a JobManager and {args.taskmanagers} TaskManager(s) x {args.slots} slot(s) in {root} ...",
          flush=True)
    tm_options: list[str] = []
    if args.spark_master:
        tm_options += ["--spark-master", args.spark_master]
    if args.spark_remote:
        tm_options += ["--spark-remote", args.spark_remote]
    for entry in args.spark_conf:
        tm_options += ["--spark-conf", entry]
    if args.workers is not None and args.spark != "standalone":
        raise localcluster.ClusterRefused("--workers is for --spark standalone")
    workers = (args.workers or 2) if args.spark == "standalone" else 0
    info = localcluster.start(localcluster.ClusterSpec(
        root, args.taskmanagers, args.slots, port=args.port, data_dir=args.data_dir, dynamic=args.dynamic,
        no_spark=args.no_spark, timeout=args.timeout, ha=args.ha, jobmanagers=args.jobmanagers,
        zookeeper_quorum=args.zookeeper_quorum, host=args.host, taskmanager_options=tm_options,
        spark_workers=workers, tls="mtls" if args.mtls else "tls" if args.tls else "none", insecure=args.insecure,
        tls_hosts=args.tls_host))
    leads = " (leader)" if info.high_availability != "none" else ""
    rows = [[info.jobmanager.name + leads, info.address, "", str(info.jobmanager.pid), str(info.jobmanager.log)]]
    rows += [[jm.name + " (standby)", "", "", str(jm.pid), str(jm.log)] for jm in info.standbys]
    rows += [[tm.name, "", str(info.slots_per_taskmanager), str(tm.pid), str(tm.log)] for tm in info.taskmanagers]
    if info.zookeeper is not None:
        rows.insert(0, [info.zookeeper.name, info.zookeeper_quorum, "", str(info.zookeeper.pid), str(info.zookeeper.log)])
    if info.spark_master:
        rows.append([f"spark standalone ({workers} worker(s))", info.spark_master, "", "",
                     str(root / clusterdir.STANDALONE_DIR / "log")])
    print("\n".join(table_lines(["PROCESS", "ADDRESS", "SLOTS", "PID", "LOG"], rows)))
    total = len(info.taskmanagers) * info.slots_per_taskmanager
    print(f"cluster running: JobManager at {info.address}, {len(info.taskmanagers)} TaskManager(s), "
          f"{total} slot(s); data dir {info.data_dir}")
    if info.dashboard_url:
        print(f"web dashboard: {info.dashboard_url}  (log in with the client token: open "
              f"{info.dashboard_url}?token=$(cat {root / 'security' / 'client.token'}))")
    tls = {"tls": "TLS", "mtls": "mutual TLS"}.get(clusterdir.tls_mode(root), "plaintext (loopback)")
    if args.insecure and args.host:
        tls = "plaintext, reachable from other machines (--insecure)"
    print(f"security: {tls}; every call needs the tokens in {root / 'security'} (mode 0700), which "
          "funke commands and the SDK read from there")
    dir_flag = "" if root == default_cluster_dir().resolve() else f" --dir {root}"
    if dir_flag:
        print(f"other commands find it with: export FUNKE_CLUSTER_DIR={root}  (or --jobmanager {info.address})")
    print(f"stop it with: funke cluster stop{dir_flag}")
    return EXIT_OK


def cmd_cluster_secrets(args: argparse.Namespace) -> int:
    root = cluster_dir(args)
    mode = "mtls" if args.mtls else "tls" if args.tls else "none"
    folder = localcluster.prepare_security(root, mode, args.host, args.tls_host)
    print(f"secrets in {folder} (0700): client.token (clients), cluster.token (TaskManagers)"
          + (f"; {'mutual ' if mode == 'mtls' else ''}TLS in {folder / 'tls'}: ca.pem, node.pem + node.key "
             "(every JobManager and TaskManager), client.pem + client.key (clients)" if mode != "none" else ""))
    print("processes started with these (the -D flags, or the same keys in a --config file):")
    print("  " + " ".join(clusterdir.security_options(root)))
    return EXIT_OK


def cmd_cluster_kill(args: argparse.Namespace) -> int:
    root = cluster_dir(args)
    pid = localcluster.kill(root, args.name)  # a process the cluster recorded, by its pid
    print(f"{args.name} (pid {pid}) killed")
    return EXIT_OK


def cmd_cluster_add_taskmanager(args: argparse.Namespace) -> int:
    root = cluster_dir(args)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", args.name) or clusterdir.is_jobmanager(args.name) \
            or args.name == clusterdir.ZOOKEEPER:
        print_error(f"{args.name!r} is no TaskManager name: letters, digits, '.', '_', '-' (e.g. tm-3)")
        return EXIT_USAGE
    info = localcluster.start_taskmanager(root, args.name, args.slots, timeout=args.timeout)
    print(f"{info.name} (pid {info.pid}) registered; log {info.log}")
    return EXIT_OK


def cmd_cluster_add_jobmanager(args: argparse.Namespace) -> int:
    root = cluster_dir(args)
    if args.name is not None and not re.fullmatch(r"jobmanager(-[A-Za-z0-9][A-Za-z0-9_.]{0,31})?", args.name):
        print_error(f"{args.name!r} is no JobManager name: jobmanager, or jobmanager-<letters, digits, '.', '_'> "
               "(e.g. jobmanager-3)")
        return EXIT_USAGE
    info = localcluster.start_jobmanager(root, args.name, timeout=args.timeout)
    lease = clusterdir.wait_for_leader(root, args.timeout)
    if lease is None:
        role = "no leader is elected yet"
    elif clusterdir.leader_name(root) == info.name:
        role = f"it leads (epoch {lease.epoch})"
    else:
        role = f"standby; the leader is {lease.address} (epoch {lease.epoch})"
    print(f"{info.name} (pid {info.pid}) serves: {role}; log {info.log}")
    return EXIT_OK


def cmd_cluster_stop(args: argparse.Namespace) -> int:
    root = cluster_dir(args)
    outcomes = localcluster.stop(root, timeout=args.timeout)
    if not outcomes:
        print(f"no cluster recorded in {root}; nothing to stop")
        return EXIT_OK
    for process, outcome in outcomes:
        joined = "" if process.recorded else ", joined by hand"
        print(f"{process.name} (pid {process.pid}{joined}): {outcome}")
    return EXIT_OK


def cmd_cluster_status(args: argparse.Namespace) -> int:
    root = cluster_dir(args)
    st = clusterdir.status(root)
    if args.json:
        print_json({
            "dir": str(st.dir),
            "running": st.running,
            "address": st.address,
            "processes": [{"name": p.name, "pid": p.pid, "alive": p.alive, "log": str(p.log),
                           **({} if p.recorded else {"recorded": False, "address": p.address, "host": p.host})}
                          for p in st.processes],
            "overview": to_dict(st.overview) if st.overview is not None else None,
            "error": st.error or None,
            "high_availability": st.high_availability,
            "tls": clusterdir.tls_mode(root),
            "leader": ({"epoch": st.lease.epoch, "address": st.lease.address, "holder": st.lease.holder,
                        "since": st.lease.since, "valid": st.lease.valid(time.time())}
                       if st.lease is not None else None),
            "spark_standalone": _standalone_json(st.standalone),
        })
        return EXIT_OK if st.running else EXIT_UNSUCCESSFUL
    if not st.processes:
        print(f"no cluster recorded in {root}")
        return EXIT_UNSUCCESSFUL
    print(f"cluster in {st.dir}: {'running' if st.running else 'NOT running'}")
    lease = st.lease
    leader_pid = lease.holder.split(":")[1] if lease is not None and lease.holder.count(":") >= 2 else ""
    if st.high_availability != "none":
        if lease is not None and lease.valid(time.time()):
            print(f"high availability: {st.high_availability}; leader epoch {lease.epoch} at {lease.address} "
                  f"(pid {leader_pid}) since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(lease.since))}")
        else:
            print(f"high availability: {st.high_availability}; no leader right now"
                  + (f" (last: epoch {lease.epoch})" if lease is not None else ""))
    registered = {tm.id: tm for tm in st.overview.task_managers} if st.overview is not None else {}
    rows = []
    for p in st.processes:
        tm = registered.get(p.name)
        if clusterdir.is_jobmanager(p.name) and st.high_availability != "none":
            leads = lease is not None and lease.valid(time.time()) and str(p.pid) == leader_pid
            detail = f"leader, epoch {lease.epoch}, {st.address}" if leads and lease else "standby"
            if not p.recorded:
                detail += (f" at {p.address}" if not leads else "") + ", joined by hand (not started by `funke cluster`)"
        elif p.name == clusterdir.JOBMANAGER:
            detail = st.address or "-"
        elif p.name == clusterdir.ZOOKEEPER:
            detail = "the cluster's ZooKeeper server"
        elif tm is not None:
            detail = f"{tm.address}, {tm.slots_free}/{tm.slots_total} slots free"
        elif p.name.startswith(clusterdir.SPARK_PREFIX) and st.standalone is not None:
            detail = _standalone_detail(p, st.standalone)
        else:
            detail = "not registered" if st.overview is not None else "-"
        rows.append([p.name, str(p.pid), "alive" if p.alive else "dead", detail])
    print("\n".join(table_lines(["PROCESS", "PID", "STATE", "DETAIL"], rows)))
    if st.overview is not None:
        o = st.overview
        others = [tm.id for tm in o.task_managers if tm.id not in {p.name for p in st.processes}]
        print(f"{len(o.task_managers)} TaskManager(s) registered, {o.slots_free}/{o.slots_total} slot(s) free"
              + (f" (also registered from elsewhere: {', '.join(others)})" if others else ""))
        jobs = ", ".join(f"{n} {s}" for s, n in sorted(o.jobs_by_status.items())) or "none"
        print(f"jobs: {jobs}; data dir {o.data_dir or '-'}")
    tls = {"tls": "TLS", "mtls": "mutual TLS"}.get(clusterdir.tls_mode(root), "no TLS")
    print(f"security: tokens in {root / 'security'}, {tls}")
    if st.error:
        print(f"problem: {st.error}")
    return EXIT_OK if st.running else EXIT_UNSUCCESSFUL


def _standalone_detail(p: clusterdir.ProcessInfo, spark: clusterdir.StandaloneStatus) -> str:
    """What the Spark standalone Master says of itself or of one of our Workers."""
    if p.name == clusterdir.SPARK_PREFIX + "master":
        if spark.error:
            return f"{spark.master_url}; its web UI {spark.web_url} told nothing: {spark.error}"
        return f"{spark.master_url}, web UI {spark.web_url}; {spark.workers_alive}/{spark.workers_known} worker(s) ALIVE"
    entry = spark.workers.get(p.name)
    if spark.error:
        return "-"
    if entry is None:
        return "not registered with the master"
    return (f"{entry.get('state')} at the master, {entry.get('coresused')}/{entry.get('cores')} core(s) used"
            if entry.get("state") == "ALIVE" else f"{entry.get('state')} at the master")


def _standalone_json(spark: clusterdir.StandaloneStatus | None) -> dict | None:
    if spark is None:
        return None
    return {"master_url": spark.master_url, "web_url": spark.web_url, "workers_alive": spark.workers_alive,
            "workers_known": spark.workers_known, "error": spark.error or None,
            "workers": {name: {"id": e.get("id"), "state": e.get("state"), "cores": e.get("cores"),
                               "cores_used": e.get("coresused")} for name, e in spark.workers.items()}}


def run_process(kind: str, argv: list[str]) -> int:
    if kind == "jobmanager":
        from funke.jobmanager.main import main as run
    else:
        from funke.taskmanager.main import main as run
    return run(argv)
