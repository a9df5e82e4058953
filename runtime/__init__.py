"""What funke's processes stand on: gRPC servers and channels (`rpc`), security applied to sockets
and files (`security`), the data directory's filesystems (`datafs`), the high-availability services
on files or ZooKeeper (`haservices`, `hafilesystem`, `hazookeeper`), the metrics endpoint
(`metricsserver`) and the configuration file (`configfile`). Used by the JobManager and the
TaskManagers; it imports only `funke.common` below it."""
