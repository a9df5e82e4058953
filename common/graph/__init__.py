"""What a job is: the JobGraph a user submits (`jobgraph`, its operator catalogue `operators`),
the rules it must satisfy (`validation`), its streaming query settings (`streamingjob`) and restart
strategy (`restart`), its parallel form (`executiongraph`) and the deployment contract between the
JobManager and the TaskManagers (`deployment`)."""
