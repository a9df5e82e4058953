"""Bytes that are not the method's message are the client's error: INVALID_ARGUMENT, and the
servicer never sees them (grpc-python alone answers UNKNOWN "Unexpected DecodeError")."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from funke.runtime.rpc import add_service
from funke.v1 import cluster_pb2, cluster_pb2_grpc, job_pb2, jobmanager_pb2, jobmanager_pb2_grpc

JOB_MANAGER = jobmanager_pb2.DESCRIPTOR.services_by_name["JobManager"]
RESOURCE_MANAGER = cluster_pb2.DESCRIPTOR.services_by_name["ResourceManager"]
# A field 1 (job_id, a string) holding bytes that are not UTF-8: the wire format itself is fine.
NOT_UTF8 = b"\x0a\x02\xff\xfe"
TRUNCATED = b"\x0a\x10abc"  # a length prefix longer than what follows


class Servicer(jobmanager_pb2_grpc.JobManagerServicer, cluster_pb2_grpc.ResourceManagerServicer):
    def __init__(self) -> None:
        self.seen: list[object] = []

    async def GetJob(self, request, context):
        self.seen.append(request)
        return job_pb2.JobDetails(job_id=request.job_id)

    async def WatchJob(self, request, context):
        self.seen.append(request)
        yield jobmanager_pb2.JobEvent(sequence=1)

    async def Heartbeat(self, requests, context):
        async for beat in requests:
            self.seen.append(beat)
            yield cluster_pb2.HeartbeatResponse()


async def _exchange(call):
    try:
        result = await call
        return "OK", result
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, exc.details()


@pytest.mark.parametrize("body", [NOT_UTF8, TRUNCATED, b"\xff" * 32])
def test_undecodable_requests_get_invalid_argument_on_every_kind_of_method(body):
    async def scenario():
        servicer = Servicer()
        server = grpc.aio.server()
        add_service(server, servicer, JOB_MANAGER)
        add_service(server, servicer, RESOURCE_MANAGER)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                raw = dict(request_serializer=None, response_deserializer=None)
                unary = channel.unary_unary("/funke.v1.JobManager/GetJob", **raw)
                code, details = await _exchange(unary(body, timeout=10))
                assert code == "INVALID_ARGUMENT" and "funke.v1.JobManager/GetJob" in details
                assert "not a valid funke.v1.GetJobRequest" in details

                stream = channel.unary_stream("/funke.v1.JobManager/WatchJob", **raw)(body, timeout=10)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    async for _ in stream:
                        pass
                assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT

                beats = channel.stream_stream("/funke.v1.ResourceManager/Heartbeat", **raw)(
                    iter([cluster_pb2.HeartbeatRequest(task_manager_id="tm").SerializeToString(), body]), timeout=10)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    async for _ in beats:
                        pass
                assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert len(servicer.seen) == 1  # the good heartbeat only

                code, result = await _exchange(unary(jobmanager_pb2.GetJobRequest(job_id="j").SerializeToString(),
                                                     timeout=10))
                assert code == "OK" and job_pb2.JobDetails.FromString(result).job_id == "j"
        finally:
            await server.stop(None)

    asyncio.run(scenario())
