"""The JobManager's cores: the JobMaster's scheduler (`scheduler`) with the decisions it asks for
(`schedulingstrategy`, `regions`, `failover`, `slotsharing`, `deploymentfactory`), the flow of
micro-batches through a streaming query's tasks (`batchflow`), and the ResourceManager's slot
bookkeeping (`slotmanager`)."""
