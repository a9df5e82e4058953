"""The JobManager's cores: the JobMaster's scheduler (`scheduler`) with the decisions it asks for
(`schedulingstrategy`, `regions`, `failover`, `slotsharing`, `deploymentfactory`), the flow of
micro-batches through a streaming query's tasks (`batchflow`), one run of a streaming query
(`queryrun`: the coordinator, the batch flow and backpressure as one core), and the ResourceManager's slot
bookkeeping (`slotmanager`)."""
