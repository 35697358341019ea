"""The subscriber's gap handling over real ZMQ sockets, against a test-driven publisher that
speaks vLLM's protocol but can skip sequence numbers on the live stream (what a slow subscriber
or a full HWM causes): the gap is filled by replay, or given up (resync) when the engine no longer
buffers it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import zmq
import zmq.asyncio

from motor_common.kv_events import (
    END_SEQ,
    BlockStored,
    EventBatch,
    Flavour,
    encode_batch,
    parse_seq,
    seq_bytes,
)
from motor_coordinator.kv_index import KvIndex
from motor_coordinator.kv_subscriber import EventSource, KvEventSubscriber
from tests.helpers import wait_for

H = [bytes([i]) * 32 for i in range(8)]


def payload(i: int) -> bytes:
    return encode_batch(Flavour.VLLM, EventBatch(0.0, (BlockStored((H[i],), None, (), 16),), 0))


async def test_gap_is_replayed_then_resynced_when_lost() -> None:
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    router = ctx.socket(zmq.ROUTER)
    for s in (pub, router):
        s.setsockopt(zmq.LINGER, 0)
    pub.bind("tcp://127.0.0.1:0")
    router.bind("tcp://127.0.0.1:0")
    buffer: dict[int, bytes] = {0: payload(0)}

    async def serve_replay() -> None:
        while True:
            client, _, start = await router.recv_multipart()
            for seq in sorted(buffer):
                if seq >= parse_seq(start):
                    await router.send_multipart([client, b"", b"kv", seq_bytes(seq), buffer[seq]])
            await router.send_multipart([client, b"", b"", END_SEQ, b""])

    server = asyncio.create_task(serve_replay())
    index = KvIndex()
    sub = KvEventSubscriber(index, replay_timeout_s=2.0)
    try:
        sub.set_sources([EventSource("e", "m", Flavour.VLLM, pub.getsockopt_string(zmq.LAST_ENDPOINT),
                                     router.getsockopt_string(zmq.LAST_ENDPOINT), "kv")])
        await wait_for(lambda: index.prefix_lengths("m", [H[0]], ["e"])["e"] == 1, what="catch-up")

        async def send_live(seq: int) -> None:  # re-sent until seen: a repeat is a duplicate
            await pub.send_multipart([b"kv", seq_bytes(seq), buffer[seq]])

        buffer[1] = payload(1)  # published but missed live
        buffer[2] = payload(2)
        await wait_for(lambda: _sent_and(send_live(2), lambda: index.last_seq("e") == 2), what="gap filled")
        assert index.prefix_lengths("m", [H[0]], ["e"]) == {"e": 1}
        assert index.block_count("e") == 3 and sub.resyncs == 0

        # 3 is lost for good (not even in the engine's buffer): resync from 4
        buffer[4] = payload(4)
        await wait_for(lambda: _sent_and(send_live(4), lambda: index.last_seq("e") == 4), what="resync")
        assert sub.resyncs == 1
        assert index.block_count("e") == 1 and index.prefix_lengths("m", [H[4]], ["e"]) == {"e": 1}
        assert not index.is_stale("e")
    finally:
        await sub.close()
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server
        pub.close(0)
        router.close(0)
        ctx.term()


async def _sent_and(send: Awaitable[None], check: Callable[[], bool]) -> bool:
    await send
    await asyncio.sleep(0)
    return check()
