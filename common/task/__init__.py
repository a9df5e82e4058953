"""The TaskManager's core (`taskexecutorstate`): its slots, the tasks deployed into them, the
input gates they wait on (`inputgates`), and the combiner rules of keyed aggregates (`combine`).
It stands on graph/ and streaming/, never on the JobManager's scheduling/."""
