"""The engine's KV-event publisher (``--kv-events-config``): ZMQ PUB + ROUTER replay.

Speaks the engine's own transport (docs/kv-events.md): every batch goes out as
``[topic, seq (8 bytes big endian), payload]`` on PUB, sequence numbers from 0 per process; the
last ``buffer_steps`` batches are kept, and a replay request ``[b"", start_seq]`` on the ROUTER is
answered with every kept batch from ``start_seq`` (vLLM: ``[b"", topic, seq, payload]``, SGLang:
``[b"", seq, payload]``) and an end marker with sequence -1. Batches are formed from the block
manager's queued events whenever it signals new ones (one batch per wake-up, like vLLM's one batch
per engine step).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from motor_common.kv_events import (
    END_SEQ,
    BlockStored,
    EventBatch,
    Flavour,
    KVEvent,
    encode_batch,
    parse_seq,
    seq_bytes,
)

log = logging.getLogger("motor_sim.kv_events")

_KEYS_VLLM = {
    "enable_kv_cache_events",
    "publisher",
    "endpoint",
    "replay_endpoint",
    "buffer_steps",
    "hwm",
    "max_queue_size",
    "topic",
}
_KEYS_SGLANG = _KEYS_VLLM - {"enable_kv_cache_events"}


@dataclass(frozen=True)
class KvEventsConfig:
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    topic: str = ""


def parse_kv_events_config(
    flavour: Flavour, raw: dict[str, object], dp_rank: int = 0
) -> KvEventsConfig | None:
    """The engine's ``--kv-events-config`` (None = events off); ValueError names the bad key."""
    allowed = _KEYS_VLLM if flavour is Flavour.VLLM else _KEYS_SGLANG
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}"
        )
    if flavour is Flavour.VLLM:
        enabled = raw.get("enable_kv_cache_events", False)
        if not isinstance(enabled, bool):
            raise ValueError("enable_kv_cache_events must be true or false")
        publisher = raw.get("publisher", "zmq" if enabled else "null")
    else:
        enabled = True
        publisher = raw.get("publisher", "null")
    if publisher not in ("null", "zmq"):
        raise ValueError(f"publisher must be 'null' or 'zmq', got {publisher!r}")
    if not enabled or publisher == "null":
        return None
    endpoint = raw.get("endpoint", "tcp://*:5557")
    replay = raw.get("replay_endpoint")
    topic = raw.get("topic", "")
    if not isinstance(endpoint, str) or not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
        raise ValueError(f"endpoint must be a ZMQ address like tcp://*:5557, got {endpoint!r}")
    if replay is not None and (
        not isinstance(replay, str) or not replay.startswith(("tcp://", "ipc://"))
    ):
        raise ValueError(f"replay_endpoint must be a ZMQ address like tcp://*:5558, got {replay!r}")
    if not isinstance(topic, str):
        raise ValueError("topic must be a string")
    ints: dict[str, int] = {}
    for key, default in (("buffer_steps", 10_000), ("hwm", 100_000), ("max_queue_size", 100_000)):
        v = raw.get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 10_000_000:
            raise ValueError(f"{key} must be an integer in 1..10000000, got {v!r}")
        ints[key] = v
    return KvEventsConfig(
        endpoint=_offset(endpoint, dp_rank),
        replay_endpoint=None if replay is None else _offset(replay, dp_rank),
        buffer_steps=ints["buffer_steps"],
        hwm=ints["hwm"],
        topic=topic,
    )


def _offset(endpoint: str, dp_rank: int) -> str:
    """The engines' ``offset_endpoint_port``: data-parallel rank r publishes on port + r."""
    if dp_rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{dp_rank}"
    base, _, port = endpoint.rpartition(":")
    if port.isdigit() and int(port) != 0:
        return f"{base}:{int(port) + dp_rank}"
    return endpoint


def _bind_or_connect(sock: zmq.asyncio.Socket, endpoint: str) -> None:
    if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
        sock.bind(endpoint)
    else:
        sock.connect(endpoint)


class KvEventPublisher:
    def __init__(
        self,
        flavour: Flavour,
        cfg: KvEventsConfig,
        take: Callable[[], list[KVEvent]],
        dp_rank: int = 0,
    ) -> None:
        self.flavour = flavour
        self.cfg = cfg
        self._take = take
        self._dp_rank = dp_rank
        self._ctx = zmq.asyncio.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.set_hwm(cfg.hwm)
        _bind_or_connect(self._pub, cfg.endpoint)
        self._replay: zmq.asyncio.Socket | None = None
        if cfg.replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(cfg.replay_endpoint)
        self._topic = cfg.topic.encode()
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=cfg.buffer_steps)
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.published = 0

    @property
    def endpoints(self) -> tuple[str, str | None]:
        """The bound addresses (a ``:0`` port resolved)."""
        pub = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        rep = None if self._replay is None else self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        return pub, rep

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._publish_loop(), name="kv-events-publisher"))
        if self._replay is not None:
            self._tasks.append(asyncio.create_task(self._replay_loop(), name="kv-events-replay"))
        for t in self._tasks:
            t.add_done_callback(_log_death)

    def poke(self) -> None:
        self._wake.set()

    def _batches(self, events: list[KVEvent]) -> list[EventBatch]:
        ts = time.time()
        if self.flavour is Flavour.VLLM:
            return [EventBatch(ts, tuple(events), self._dp_rank)]
        # SGLang's radix cache reports one BlockStored per page.
        out: list[KVEvent] = []
        for e in events:
            if isinstance(e, BlockStored) and len(e.block_hashes) > 1:
                bs = e.block_size
                parent = e.parent_block_hash
                for i, h in enumerate(e.block_hashes):
                    out.append(BlockStored((h,), parent, e.token_ids[i * bs : (i + 1) * bs], bs))
                    parent = h
            else:
                out.append(e)
        return [EventBatch(ts, tuple(out))]

    async def flush(self) -> None:
        events = self._take()
        if not events:
            return
        for batch in self._batches(events):
            payload = encode_batch(self.flavour, batch)
            seq = self._seq
            self._seq += 1
            self._buffer.append((seq, payload))
            with contextlib.suppress(zmq.Again):
                await self._pub.send_multipart(
                    (self._topic, seq_bytes(seq), payload), flags=zmq.NOBLOCK
                )
            self.published += 1

    async def _publish_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.flush()

    async def _replay_loop(self) -> None:
        assert self._replay is not None
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3:
                log.warning("invalid KV-event replay request (%d frames)", len(frames))
                continue
            client, _empty, start = frames
            try:
                start_seq = parse_seq(start)
            except ValueError:
                log.warning("invalid KV-event replay start sequence")
                continue
            for seq, payload in list(self._buffer):
                if seq >= start_seq:
                    if self.flavour is Flavour.VLLM:
                        reply = [client, b"", self._topic, seq_bytes(seq), payload]
                    else:
                        reply = [client, b"", seq_bytes(seq), payload]
                    await self._replay.send_multipart(reply)
            if self.flavour is Flavour.VLLM:
                await self._replay.send_multipart([client, b"", b"", END_SEQ, b""])
            else:
                await self._replay.send_multipart([client, b"", END_SEQ, b""])

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._pub.close(0)
        if self._replay is not None:
            self._replay.close(0)
        self._ctx.term()


def _log_death(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s died: %r", task.get_name(), task.exception())
