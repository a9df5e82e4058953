import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from funke.v1 import jobgraph_pb2 as _jobgraph_pb2
from funke.v1 import job_pb2 as _job_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RescaleJobRequest(_message.Message):
    __slots__ = ("job_id", "parallelism", "vertex_id", "timeout_seconds")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    VERTEX_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    parallelism: int
    vertex_id: _containers.RepeatedScalarFieldContainer[str]
    timeout_seconds: float
    def __init__(self, job_id: _Optional[str] = ..., parallelism: _Optional[int] = ..., vertex_id: _Optional[_Iterable[str]] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class RescaleJobResponse(_message.Message):
    __slots__ = ("message", "parallelism", "last_batch_id")
    class ParallelismEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    LAST_BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    message: str
    parallelism: _containers.ScalarMap[str, int]
    last_batch_id: int
    def __init__(self, message: _Optional[str] = ..., parallelism: _Optional[_Mapping[str, int]] = ..., last_batch_id: _Optional[int] = ...) -> None: ...

class GetKeyedStateRequest(_message.Message):
    __slots__ = ("job_id", "vertex_id", "key", "limit")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    VERTEX_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    vertex_id: str
    key: _containers.RepeatedScalarFieldContainer[str]
    limit: int
    def __init__(self, job_id: _Optional[str] = ..., vertex_id: _Optional[str] = ..., key: _Optional[_Iterable[str]] = ..., limit: _Optional[int] = ...) -> None: ...

class KeyedState(_message.Message):
    __slots__ = ("vertex_id", "batch_id", "arrow_ipc_stream", "row_count", "matching_keys")
    VERTEX_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ARROW_IPC_STREAM_FIELD_NUMBER: _ClassVar[int]
    ROW_COUNT_FIELD_NUMBER: _ClassVar[int]
    MATCHING_KEYS_FIELD_NUMBER: _ClassVar[int]
    vertex_id: str
    batch_id: int
    arrow_ipc_stream: bytes
    row_count: int
    matching_keys: int
    def __init__(self, vertex_id: _Optional[str] = ..., batch_id: _Optional[int] = ..., arrow_ipc_stream: _Optional[bytes] = ..., row_count: _Optional[int] = ..., matching_keys: _Optional[int] = ...) -> None: ...

class StopJobRequest(_message.Message):
    __slots__ = ("job_id", "drain", "timeout_seconds")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    drain: bool
    timeout_seconds: float
    def __init__(self, job_id: _Optional[str] = ..., drain: _Optional[bool] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class StopJobResponse(_message.Message):
    __slots__ = ("status", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: _job_pb2.JobStatus
    message: str
    def __init__(self, status: _Optional[_Union[_job_pb2.JobStatus, str]] = ..., message: _Optional[str] = ...) -> None: ...

class GetQueryProgressRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class QueryProgress(_message.Message):
    __slots__ = ("query_id", "checkpoint_location", "progress_json")
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_LOCATION_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_JSON_FIELD_NUMBER: _ClassVar[int]
    query_id: str
    checkpoint_location: str
    progress_json: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, query_id: _Optional[str] = ..., checkpoint_location: _Optional[str] = ..., progress_json: _Optional[_Iterable[str]] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("job_graph",)
    JOB_GRAPH_FIELD_NUMBER: _ClassVar[int]
    job_graph: _jobgraph_pb2.JobGraph
    def __init__(self, job_graph: _Optional[_Union[_jobgraph_pb2.JobGraph, _Mapping]] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_job_pb2.JobSummary]
    def __init__(self, jobs: _Optional[_Iterable[_Union[_job_pb2.JobSummary, _Mapping]]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _job_pb2.JobStatus
    def __init__(self, status: _Optional[_Union[_job_pb2.JobStatus, str]] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ExecutionStateChange(_message.Message):
    __slots__ = ("attempt", "task_name", "transition", "task_manager_id", "failure")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TASK_NAME_FIELD_NUMBER: _ClassVar[int]
    TRANSITION_FIELD_NUMBER: _ClassVar[int]
    TASK_MANAGER_ID_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    attempt: _job_pb2.ExecutionAttemptId
    task_name: str
    transition: _job_pb2.ExecutionStateTransition
    task_manager_id: str
    failure: _job_pb2.Failure
    def __init__(self, attempt: _Optional[_Union[_job_pb2.ExecutionAttemptId, _Mapping]] = ..., task_name: _Optional[str] = ..., transition: _Optional[_Union[_job_pb2.ExecutionStateTransition, _Mapping]] = ..., task_manager_id: _Optional[str] = ..., failure: _Optional[_Union[_job_pb2.Failure, _Mapping]] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("sequence", "snapshot", "job_status", "execution_state", "waiting_for_resources", "streaming")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    JOB_STATUS_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_STATE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    STREAMING_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    snapshot: _job_pb2.JobDetails
    job_status: _job_pb2.JobStatusTransition
    execution_state: ExecutionStateChange
    waiting_for_resources: str
    streaming: StreamingEvent
    def __init__(self, sequence: _Optional[int] = ..., snapshot: _Optional[_Union[_job_pb2.JobDetails, _Mapping]] = ..., job_status: _Optional[_Union[_job_pb2.JobStatusTransition, _Mapping]] = ..., execution_state: _Optional[_Union[ExecutionStateChange, _Mapping]] = ..., waiting_for_resources: _Optional[str] = ..., streaming: _Optional[_Union[StreamingEvent, _Mapping]] = ...) -> None: ...

class StreamingEvent(_message.Message):
    __slots__ = ("kind", "batch_id", "at", "info_json")
    KIND_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    kind: str
    batch_id: int
    at: _timestamp_pb2.Timestamp
    info_json: str
    def __init__(self, kind: _Optional[str] = ..., batch_id: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., info_json: _Optional[str] = ...) -> None: ...

class GetClusterOverviewRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SlotInfo(_message.Message):
    __slots__ = ("index", "job_id")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    index: int
    job_id: str
    def __init__(self, index: _Optional[int] = ..., job_id: _Optional[str] = ...) -> None: ...

class TaskManagerInfo(_message.Message):
    __slots__ = ("id", "address", "slots_total", "slots_free", "registered_at", "last_heartbeat", "resources", "slots")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FREE_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    slots_total: int
    slots_free: int
    registered_at: _timestamp_pb2.Timestamp
    last_heartbeat: _timestamp_pb2.Timestamp
    resources: _containers.ScalarMap[str, str]
    slots: _containers.RepeatedCompositeFieldContainer[SlotInfo]
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., slots_total: _Optional[int] = ..., slots_free: _Optional[int] = ..., registered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_heartbeat: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., resources: _Optional[_Mapping[str, str]] = ..., slots: _Optional[_Iterable[_Union[SlotInfo, _Mapping]]] = ...) -> None: ...

class ClusterOverview(_message.Message):
    __slots__ = ("task_managers", "slots_total", "slots_free", "jobs_by_status", "data_dir", "leader")
    class JobsByStatusEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TASK_MANAGERS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FREE_FIELD_NUMBER: _ClassVar[int]
    JOBS_BY_STATUS_FIELD_NUMBER: _ClassVar[int]
    DATA_DIR_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    task_managers: _containers.RepeatedCompositeFieldContainer[TaskManagerInfo]
    slots_total: int
    slots_free: int
    jobs_by_status: _containers.ScalarMap[str, int]
    data_dir: str
    leader: LeaderInfo
    def __init__(self, task_managers: _Optional[_Iterable[_Union[TaskManagerInfo, _Mapping]]] = ..., slots_total: _Optional[int] = ..., slots_free: _Optional[int] = ..., jobs_by_status: _Optional[_Mapping[str, int]] = ..., data_dir: _Optional[str] = ..., leader: _Optional[_Union[LeaderInfo, _Mapping]] = ...) -> None: ...

class LeaderInfo(_message.Message):
    __slots__ = ("high_availability", "epoch", "address", "job_manager", "since")
    HIGH_AVAILABILITY_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    JOB_MANAGER_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    high_availability: str
    epoch: int
    address: str
    job_manager: str
    since: _timestamp_pb2.Timestamp
    def __init__(self, high_availability: _Optional[str] = ..., epoch: _Optional[int] = ..., address: _Optional[str] = ..., job_manager: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetJobResultRequest(_message.Message):
    __slots__ = ("job_id", "vertex_id", "from_batch", "max_batches")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    VERTEX_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCHES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    vertex_id: str
    from_batch: int
    max_batches: int
    def __init__(self, job_id: _Optional[str] = ..., vertex_id: _Optional[str] = ..., from_batch: _Optional[int] = ..., max_batches: _Optional[int] = ...) -> None: ...

class JobResult(_message.Message):
    __slots__ = ("vertex_id", "arrow_ipc_stream", "row_count", "batches")
    VERTEX_ID_FIELD_NUMBER: _ClassVar[int]
    ARROW_IPC_STREAM_FIELD_NUMBER: _ClassVar[int]
    ROW_COUNT_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    vertex_id: str
    arrow_ipc_stream: bytes
    row_count: int
    batches: _containers.RepeatedCompositeFieldContainer[BatchRows]
    def __init__(self, vertex_id: _Optional[str] = ..., arrow_ipc_stream: _Optional[bytes] = ..., row_count: _Optional[int] = ..., batches: _Optional[_Iterable[_Union[BatchRows, _Mapping]]] = ...) -> None: ...

class BatchRows(_message.Message):
    __slots__ = ("batch_id", "arrow_ipc_stream", "row_count")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ARROW_IPC_STREAM_FIELD_NUMBER: _ClassVar[int]
    ROW_COUNT_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    arrow_ipc_stream: bytes
    row_count: int
    def __init__(self, batch_id: _Optional[int] = ..., arrow_ipc_stream: _Optional[bytes] = ..., row_count: _Optional[int] = ...) -> None: ...
