"""Talking to a funke cluster from Python: the JobManager's client, the errors it raises, and
job files loaded as `funke submit` loads them.

    from funke.client import JobManagerClient, load_job_file

    with JobManagerClient("127.0.0.1:6123") as client:   # tokens and TLS found as the CLI finds them
        job_id = client.submit(load_job_file("examples/wordcount.py", ["--parallelism", "4"]))
        for event in client.watch(job_id):
            ...
        rows = client.result(job_id)

Every error is a `FunkeError` keeping the gRPC status code (`.code`) and the server's message;
`InvalidJobGraph.problems` lists every problem the JobManager found in a job graph. A tool that
speaks gRPC itself turns a JobGraph into its wire message (`funke.v1.jobgraph_pb2.JobGraph`, the
contract in proto/) and back with `job_graph_to_proto` / `job_graph_from_proto`.
`env.execute()` (in `funke`) is the shorter way when a job should simply run and be waited for.
"""

from funke.deploy.client import (
    DEFAULT_JOBMANAGER,
    ClientCredentials,
    FunkeError,
    InvalidJobGraph,
    JobAlreadyExists,
    JobManagerClient,
    JobManagerConnectionLost,
    JobManagerUnavailable,
    JobNotFound,
    NotAJobManager,
    NotAuthenticated,
    SecurityError,
    StandbyJobManager,
    execution_state_name,
    job_status_name,
)
from funke.common.wire.codec import job_graph_from_proto, job_graph_to_proto
from funke.deploy.jobfile import JobFileError, load_job_file

__all__ = [
    "DEFAULT_JOBMANAGER",
    "ClientCredentials",
    "FunkeError",
    "InvalidJobGraph",
    "JobAlreadyExists",
    "JobFileError",
    "JobManagerClient",
    "JobManagerConnectionLost",
    "JobManagerUnavailable",
    "JobNotFound",
    "NotAJobManager",
    "NotAuthenticated",
    "SecurityError",
    "StandbyJobManager",
    "execution_state_name",
    "job_graph_from_proto",
    "job_graph_to_proto",
    "job_status_name",
    "load_job_file",
]
