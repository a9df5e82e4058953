"""funke's pure core: state machines, graph algorithms and rules, sans-IO (events in, state and
actions out; no sockets, threads or clocks). Its floors, lowest first; a module imports only from
its own floor's package and the floors below (tests/unit/test_floors.py checks it):

    ids, states, durations, layout, leadership, security, conformance   (this package)
    streaming/    the micro-batch model: offsets, checkpoint logs, sources, the batch coordinator
    graph/        the job: JobGraph, operators, validation, restart strategy, ExecutionGraph,
                  the deployment contract between JobManager and TaskManagers
    scheduling/   the JobManager's cores: scheduler, regions, failover, slot sharing, slot manager
    task/         the TaskManager's core: slots, tasks, input gates
    wire/, api/, configuration.py   the wire codec and job views, the DSL, the cluster's options
"""

from funke.common import moved as _moved

_moved.install()  # the 0.2.0 module paths, for one more minor version (moved.py)
