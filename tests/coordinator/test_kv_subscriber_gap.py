"""The subscriber's gap handling over real ZMQ sockets, against a test-driven publisher that
speaks vLLM's protocol but can skip sequence numbers on the live stream (what a slow subscriber
or a full HWM causes): the gap is filled by replay, or given up (resync) when the engine no longer
buffers it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
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
from motor_coordinator import kv_subscriber
from motor_coordinator.kv_index import KvIndex
from motor_coordinator.kv_subscriber import EventSource, KvEventSubscriber
from tests.helpers import wait_for

H = [bytes([i]) * 32 for i in range(8)]


def payload(i: int) -> bytes:
    return encode_batch(Flavour.VLLM, EventBatch(0.0, (BlockStored((H[i],), None, (), 16),), 0))


@contextlib.asynccontextmanager
async def engine_sockets(replay: Callable[[zmq.asyncio.Socket], Awaitable[None]]
                         ) -> AsyncIterator[tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]]:
    """A stand-in engine: its PUB socket and its replay ROUTER socket, served by *replay*."""
    ctx = zmq.asyncio.Context()
    pub, router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
    for s in (pub, router):
        s.setsockopt(zmq.LINGER, 0)
        s.bind("tcp://127.0.0.1:0")
    server = asyncio.create_task(replay(router))
    try:
        yield pub, router
    finally:
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server
        pub.close(0)
        router.close(0)
        ctx.term()


def source(pub: zmq.asyncio.Socket, router: zmq.asyncio.Socket) -> EventSource:
    return EventSource("e", "m", Flavour.VLLM, pub.getsockopt_string(zmq.LAST_ENDPOINT),
                       router.getsockopt_string(zmq.LAST_ENDPOINT), "kv")


async def test_gap_is_replayed_then_resynced_when_lost() -> None:
    buffer: dict[int, bytes] = {0: payload(0)}

    async def serve_replay(router: zmq.asyncio.Socket) -> None:
        while True:
            client, _, start = await router.recv_multipart()
            for seq in sorted(buffer):
                if seq >= parse_seq(start):
                    await router.send_multipart([client, b"", b"kv", seq_bytes(seq), buffer[seq]])
            await router.send_multipart([client, b"", b"", END_SEQ, b""])

    index = KvIndex()
    sub = KvEventSubscriber(index, replay_timeout_s=2.0)
    async with engine_sockets(serve_replay) as (pub, router):
        try:
            sub.set_sources([source(pub, router)])
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


async def _sent_and(send: Awaitable[None], check: Callable[[], bool]) -> bool:
    await send
    await asyncio.sleep(0)
    return check()


async def test_a_failure_nobody_foresaw_marks_the_engine_stale_and_subscribes_afresh(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception the subscriber does not expect once ended the engine's task for good (only a
    log line), leaving its last blocks to steer routing; now the subscription starts again."""
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind("tcp://127.0.0.1:0")
    index = KvIndex()
    real_apply, failures = index.apply, [RuntimeError("unforeseen")]
    stale_seen: list[bool] = []

    def apply(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return real_apply(*args, **kwargs)

    monkeypatch.setattr(index, "apply", apply)
    monkeypatch.setattr(kv_subscriber, "RESUBSCRIBE_DELAY_S", 0.05)
    real_stale = index.mark_stale
    monkeypatch.setattr(index, "mark_stale", lambda engine: (stale_seen.append(True), real_stale(engine))[1])
    sub = KvEventSubscriber(index, replay_timeout_s=2.0)
    try:
        sub.set_sources([EventSource("e", "m", Flavour.VLLM, pub.getsockopt_string(zmq.LAST_ENDPOINT), None, "kv")])

        async def send(seq: int) -> None:
            await pub.send_multipart([b"kv", seq_bytes(seq), payload(seq)])

        await wait_for(lambda: _sent_and(send(0), lambda: index.last_seq("e") == 0), what="applied after the restart")
        assert sub.restarts == 1 and stale_seen and not failures
        await wait_for(lambda: _sent_and(send(1), lambda: index.last_seq("e") == 1), what="the stream goes on")
    finally:
        await sub.close()
        pub.close(0)
        ctx.term()


async def test_a_replay_that_never_ends_is_given_up_at_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each replay message came within its deadline, so a replay socket that never sent END_SEQ
    kept the subscriber collecting for ever (memory without bound, the live stream unread)."""
    monkeypatch.setattr(kv_subscriber, "MAX_REPLAY_BATCHES", 50)
    sent = [0]

    async def endless_replay(router: zmq.asyncio.Socket) -> None:
        client, _, _ = await router.recv_multipart()
        while True:  # batch 0 again and again, never END_SEQ
            await router.send_multipart([client, b"", b"kv", seq_bytes(0), payload(0)])
            sent[0] += 1
            await asyncio.sleep(0.001)

    index = KvIndex()
    sub = KvEventSubscriber(index, replay_timeout_s=2.0)
    async with engine_sockets(endless_replay) as (pub, router):
        try:
            sub.set_sources([source(pub, router)])

            async def send(seq: int) -> None:
                await pub.send_multipart([b"kv", seq_bytes(seq), payload(seq % 8)])

            # the live stream is read again once the replay is given up
            await wait_for(lambda: _sent_and(send(5), lambda: index.last_seq("e") == 5), timeout=20,
                           what="live batches applied after the endless replay was given up")
            assert sent[0] >= 50 and sub.replays >= 1
        finally:
            await sub.close()
