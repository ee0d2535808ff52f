"""How a request through the cluster ingress ends, without Ray: ClusterEngine over a
fake replica handle (a generate stream and an abort call, as Ray Serve's handle offers).

* an abort asks the request's replica (by its engine index) to end it; the handler's
  final output is the replica's own, the ingress makes none up;
* a replica that cannot be told to abort: the ingress stops reading it (a cancelled
  stream aborts the request there) and answers with an error naming the replica;
* a replica stream that ends without a final output: an error naming the replica.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

pytest.importorskip("ray")

from stepserve.cluster.frontend import ClusterEngine  # noqa: E402
from stepserve.cluster.messages import Admission  # noqa: E402
from stepserve.config.settings import EngineConfig  # noqa: E402
from stepserve.core.request import SamplingParams  # noqa: E402
from stepserve.engine.seam import NewRequest, StreamOutput  # noqa: E402
from stepserve.routing.pools import Deployment  # noqa: E402

BASE = EngineConfig().replace(num_gpu_blocks=128, max_model_len=256, max_num_seqs=8)
ENGINE = 3  # the fake replica's engine index


class FakeStream:
    """A replica's generate stream: its Admission, then what the replica puts."""

    def __init__(self, replica: FakeReplica) -> None:
        self.replica = replica
        self.admitted = False
        self.cancelled = False

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self):
        if not self.admitted:
            self.admitted = True
            return Admission(ENGINE, "default")
        out = await self.replica.outputs.get()
        if out is None:
            raise StopAsyncIteration
        return out

    def cancel(self) -> None:
        self.cancelled = True


class FakeReplica:
    def __init__(self, abort_fails: bool = False) -> None:
        self.outputs: asyncio.Queue = asyncio.Queue()
        self.aborts: list[tuple[str, str, int]] = []
        self.abort_fails = abort_fails
        self.streams: list[FakeStream] = []
        self.generate = SimpleNamespace(remote=self._generate)
        self.abort = SimpleNamespace(remote=self._abort)

    def options(self, stream: bool) -> FakeReplica:
        return self

    def _generate(self, request: NewRequest, route) -> FakeStream:
        self.streams.append(FakeStream(self))
        return self.streams[-1]

    async def _abort(self, request_id: str, message: str, target: int) -> None:
        self.aborts.append((request_id, message, target))
        if self.abort_fails:
            raise ConnectionError("replica gone")
        await self.outputs.put(StreamOutput("", 2, 1, True, "abort", message, ""))


async def _run(replica: FakeReplica, then) -> tuple[list[StreamOutput], ClusterEngine]:
    cluster = ClusterEngine(Deployment.single(BASE), {"default": replica})
    stream = await cluster.add(NewRequest([5, 6], SamplingParams(max_tokens=8)))
    await replica.outputs.put(StreamOutput("a", 2, 1))
    then(cluster, stream.request_id)
    return [out async for out in stream], cluster


def test_an_abort_is_ended_by_the_replica_and_answered_with_its_final_output():
    replica = FakeReplica()
    outs, cluster = asyncio.run(_run(replica, lambda c, rid: c.abort(rid, "client gone")))
    assert [o.text for o in outs] == ["a", ""]
    final = outs[-1]
    assert (final.finished, final.finish_reason, final.message) == (True, "abort",
                                                                     "client gone")
    assert [(m, t) for _, m, t in replica.aborts] == [("client gone", ENGINE)]
    assert cluster.num_live == 0 and not replica.streams[0].cancelled


def test_a_replica_that_cannot_be_told_is_read_no_more_and_the_answer_names_it():
    replica = FakeReplica(abort_fails=True)
    outs, cluster = asyncio.run(_run(replica, lambda c, rid: c.abort(rid, "client gone")))
    final = outs[-1]
    assert final.finish_reason == "error" and f"engine={ENGINE}" in final.message
    assert "replica gone" in final.message
    assert cluster.num_live == 0 and replica.streams[0].cancelled


def test_a_stream_without_a_final_output_is_an_error_naming_the_replica():
    replica = FakeReplica()
    outs, cluster = asyncio.run(_run(replica, lambda c, rid: replica.outputs.put_nowait(None)))
    final = outs[-1]
    assert final.finish_reason == "error" and "without a final output" in final.message
    assert f"engine={ENGINE}" in final.message and cluster.num_live == 0
