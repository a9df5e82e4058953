"""The wire form of the model: every model value to its `funke.v1` message and back (`codec`),
and what the JobManager shows of a job, built from its scheduler (`jobviews`)."""
