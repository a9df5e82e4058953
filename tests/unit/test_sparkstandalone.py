"""What `funke cluster status` reads of its own Spark standalone cluster without a Master to ask:
which of the Master's Worker entries is which of our Worker processes (its port, from its log)."""

from __future__ import annotations

from funke.deploy import sparkstandalone
from funke.deploy.sparkstandalone import ProcessInfo


def test_each_worker_process_is_matched_to_the_masters_entry_by_the_port_its_log_names(tmp_path):
    logs = {}
    for name, text in (("worker-1", "26/12/07 17:27:55 INFO Worker: Starting Spark worker 127.0.0.1:41234 with 1 "
                                    "cores, 1024.0 MiB RAM\n"),
                       ("worker-2", "26/12/07 17:27:55 INFO Worker: Starting Spark worker 127.0.0.1:41999 with 1 "
                                    "cores, 1024.0 MiB RAM\n"),
                       ("worker-3", "Spark Command: java ...\n")):  # has not said its port yet
        logs[name] = tmp_path / f"{name}.log"
        logs[name].write_text(text)
    state = {"workers": [
        {"id": "worker-20261207172755-127.0.0.1-41234", "state": "ALIVE", "cores": 1, "coresused": 1},
        {"id": "worker-20261207172755-127.0.0.1-41999", "state": "DEAD", "cores": 1, "coresused": 0},
        {"id": "worker-20261207172755-127.0.0.1-40000", "state": "ALIVE", "cores": 1, "coresused": 0},  # not ours
    ]}
    workers = [ProcessInfo(name, 1000 + i, log) for i, (name, log) in enumerate(logs.items())]
    found = sparkstandalone.workers_by_name(state, workers)
    assert {name: entry["state"] for name, entry in found.items()} == {"worker-1": "ALIVE", "worker-2": "DEAD"}
    assert sparkstandalone.worker_port(tmp_path / "missing.log") is None
