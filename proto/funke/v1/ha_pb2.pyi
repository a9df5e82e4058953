from funke.v1 import job_pb2 as _job_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ArchivedJob(_message.Message):
    __slots__ = ("details", "summary", "sequence", "collect_vertices", "archived_at")
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    COLLECT_VERTICES_FIELD_NUMBER: _ClassVar[int]
    ARCHIVED_AT_FIELD_NUMBER: _ClassVar[int]
    details: _job_pb2.JobDetails
    summary: _job_pb2.JobSummary
    sequence: int
    collect_vertices: _containers.RepeatedScalarFieldContainer[str]
    archived_at: float
    def __init__(self, details: _Optional[_Union[_job_pb2.JobDetails, _Mapping]] = ..., summary: _Optional[_Union[_job_pb2.JobSummary, _Mapping]] = ..., sequence: _Optional[int] = ..., collect_vertices: _Optional[_Iterable[str]] = ..., archived_at: _Optional[float] = ...) -> None: ...
