"""Subscribes to every engine's KV-event stream and feeds the :class:`KvIndex`.

The coordinator subscribes (not the nodemanager): scheduling happens here, the index must be
coordinator-local to be read on every request without a hop, and the coordinator already tracks
every endpoint of every model. One owned task per engine:

1. SUB on the engine's PUB endpoint (ZMQ reconnects by itself when the engine goes away and comes
   back; a restarted engine counts from 0 again, which the index takes as a reset);
2. catch up: ask the replay socket (when the engine has one) for everything from the next sequence
   number we need (0 at first);
3. apply live batches; on a gap, replay from the first missing one; what the engine no longer
   buffers is given up (:meth:`KvIndex.resync`), so the index under-estimates instead of lying.

Every replay has deadlines (``replay_timeout_s`` per message, ``REPLAY_TOTAL_S`` in all) and a
bound on its batches; an undecodable or oversized batch marks the engine stale until its stream is
whole again; a subscription that fails in a way nobody foresaw is started afresh.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from motor_common.kv_events import (
    END_SEQ,
    Flavour,
    KVEventError,
    decode_batch,
    parse_seq,
    seq_bytes,
)
from motor_common.tasks import TaskOwner
from motor_coordinator.kv_index import Gap, KvIndex

log = logging.getLogger("motor_coordinator.kv_events")

# Bounds on what an engine can make the coordinator hold: a frame larger than MAX_MESSAGE_BYTES
# drops the connection (ZMQ reconnects; the gap is replayed), at most RCVHWM messages wait, a
# replay is at most MAX_REPLAY_BATCHES batches within REPLAY_TOTAL_S seconds.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
RCVHWM = 10_000
MAX_REPLAY_BATCHES = 20_000
REPLAY_TOTAL_S = 30.0
RESUBSCRIBE_DELAY_S = 1.0


@dataclass(frozen=True)
class EventSource:
    engine: str  # the scheduler's candidate key
    model: str
    flavour: Flavour
    endpoint: str  # tcp://host:port of the engine's PUB socket
    replay_endpoint: str | None = None
    topic: str = ""


class KvEventSubscriber:
    def __init__(self, index: KvIndex, *, replay_timeout_s: float = 2.0) -> None:
        self.index = index
        self.replay_timeout_s = replay_timeout_s
        self._ctx = zmq.asyncio.Context()
        self._owner = TaskOwner("kv-events")
        self._tasks: dict[str, tuple[EventSource, asyncio.Task[None]]] = {}
        self.replays = 0
        self.resyncs = 0
        self.restarts = 0  # subscriptions started afresh after an unforeseen failure

    def set_sources(self, sources: Iterable[EventSource]) -> None:
        """Follow exactly *sources*: new engines are subscribed, gone or changed ones dropped."""
        want = {s.engine: s for s in sources}
        for engine, (src, task) in list(self._tasks.items()):
            if want.get(engine) != src:
                task.cancel()
                del self._tasks[engine]
                self.index.remove_engine(engine)
        for engine, src in want.items():
            if engine not in self._tasks:
                self.index.add_engine(engine, src.model)
                task = self._owner.spawn(self._supervise(src), name=f"kv-events {engine}")
                self._tasks[engine] = (src, task)

    async def close(self) -> None:
        for _, task in self._tasks.values():
            task.cancel()
        self._tasks.clear()
        await self._owner.close()
        self._ctx.term()

    async def _supervise(self, src: EventSource) -> None:
        """Follow *src* for as long as it is a source: a failure nobody foresaw is logged, the
        engine's index entry marked stale, and the subscription started afresh a second later
        (it once ended for good, leaving the engine's last blocks to steer routing)."""
        while True:
            try:
                await self._follow(src)
            except Exception:
                log.exception("engine %s: KV-event subscription failed; index marked stale, re-subscribing",
                              src.engine)
                self.index.mark_stale(src.engine)
                self.restarts += 1
                await asyncio.sleep(RESUBSCRIBE_DELAY_S)  # a back-off, so a persistent fault does not spin

    async def _follow(self, src: EventSource) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, RCVHWM)
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # a larger frame drops the connection
        sub.setsockopt(zmq.SUBSCRIBE, src.topic.encode())
        sub.setsockopt(zmq.IPV6, 1)
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sub.connect(src.endpoint)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    event = parse_monitor_message(await monitor.recv_multipart())
                    if event["event"] == zmq.EVENT_DISCONNECTED:
                        # the engine is gone (or restarting): what it held is not to be trusted
                        self.index.mark_stale(src.engine)
                        continue
                    # (re)connected: the engine may have restarted and published while we were
                    # away (ZMQ drops what a SUB missed): catch up from its replay buffer
                    if src.replay_endpoint is not None:
                        await self._replay(src, 0, reconnect=True)
                if sub in ready:
                    frames = await sub.recv_multipart()
                    if len(frames) != 3:
                        log.warning("engine %s: KV-event message with %d frames ignored", src.engine, len(frames))
                        continue
                    await self._handle(src, frames[1], frames[2], replayed=False)
        finally:
            sub.disable_monitor()
            monitor.close(0)
            sub.close(0)

    async def _handle(self, src: EventSource, seq_frame: bytes, payload: bytes, *, replayed: bool) -> None:
        try:
            seq = parse_seq(seq_frame)
            batch = decode_batch(src.flavour, payload)
        except KVEventError as exc:
            log.warning("engine %s: bad KV-event batch (%s); index marked stale", src.engine, str(exc)[:500])
            self.index.mark_stale(src.engine)
            return
        result = self.index.apply(src.engine, seq, batch, replayed=replayed)
        if isinstance(result, Gap) and not replayed:
            if src.replay_endpoint is not None:
                await self._replay(src, result.from_seq)
            last = self.index.last_seq(src.engine)
            if last is None or last < seq - 1:  # the engine no longer has what we missed
                self.resyncs += 1
                log.info("engine %s: KV events before %d lost; index restarts from there", src.engine, seq)
                self.index.resync(src.engine, seq)
            self.index.apply(src.engine, seq, batch, replayed=True)

    async def _replay(self, src: EventSource, start: int, *, reconnect: bool = False) -> None:
        """Apply the engine's buffered batches from *start*. After a reconnect, a buffer that
        ends before what we already applied means the engine restarted: its blocks are reset."""
        assert src.replay_endpoint is not None
        self.replays += 1
        got = await self._fetch_replay(src, start)
        if got is None:
            return
        last = self.index.last_seq(src.engine) if self.index.has_engine(src.engine) else None
        # An engine keeps its last batches for replay: an empty buffer, or one that ends before
        # what we applied, after a reconnect means it restarted.
        if reconnect and last is not None and (not got or int.from_bytes(got[-1][0], "big", signed=True) < last):
            log.info("engine %s restarted (its KV events went back); index reset", src.engine)
            self.index.restarted(src.engine)
        for seq_frame, payload in got:
            await self._handle(src, seq_frame, payload, replayed=True)
        if reconnect:
            self.index.mark_live(src.engine)  # caught up: trusted again (a reconnect marked it stale)

    async def _fetch_replay(self, src: EventSource, start: int) -> list[tuple[bytes, bytes]] | None:
        assert src.replay_endpoint is not None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sock.connect(src.replay_endpoint)
        out: list[tuple[bytes, bytes]] = []
        ends = asyncio.get_running_loop().time() + REPLAY_TOTAL_S
        try:
            await sock.send_multipart([b"", seq_bytes(start)])
            while True:
                if len(out) >= MAX_REPLAY_BATCHES:
                    log.warning("engine %s: KV-event replay from %d sent more than %d batches; given up",
                                src.engine, start, MAX_REPLAY_BATCHES)
                    return None
                try:  # each message within replay_timeout_s, the whole replay within REPLAY_TOTAL_S
                    async with asyncio.timeout_at(min(ends, asyncio.get_running_loop().time() + self.replay_timeout_s)):
                        frames = await sock.recv_multipart()
                except TimeoutError:
                    log.info("engine %s: KV-event replay from %d timed out", src.engine, start)
                    return None
                # vLLM: [b"", topic, seq, payload]; SGLang: [b"", seq, payload]
                if len(frames) < 3:
                    return out
                seq_frame, payload = frames[-2], frames[-1]
                if seq_frame == END_SEQ:
                    return out
                out.append((seq_frame, payload))
        finally:
            sock.close(0)
