"""``dispatch_mux.serve_stream`` without sockets: the commands of a DispatchMany stream in, the
events out (batched), with a scripted Dispatch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from motor_common.errors import NotFound
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_coordinator import dispatch_mux
from motor_coordinator.dispatch_mux import serve_stream


def start(sid: int, body: bytes = b"{}", timeout_ms: int = 0, degraded: bool = False,
          trace: dict[str, str] | None = None, window: int = 0) -> cpb.DispatchCommand:
    return cpb.DispatchCommand(stream_id=sid, start=cpb.DispatchStart(
        request=cpb.DispatchRequest(request_id=f"r{sid}", body=body), timeout_ms=timeout_ms, degraded=degraded,
        trace_context=trace, window_bytes=window))


class Script:
    """Dispatch of one request: a head and the body echoed as one chunk; body b"missing" fails
    NOT_FOUND, b"hang" waits until cancelled, b"big" sends ten 1000-byte chunks. A *gate* (flow
    control) is awaited before each frame, as ``DispatchServicer.frames`` does."""

    def __init__(self) -> None:
        self.calls: list[tuple[bytes, bool, float | None]] = []
        self.cancelled: list[bytes] = []
        self.traces: list[tuple[tuple[str, str], ...]] = []
        self.sent: dict[bytes, int] = {}  # frames let through the gate, by body

    async def __call__(self, request: cpb.DispatchRequest, degraded: bool, timeout: float | None,
                       trace: tuple[tuple[str, str], ...], gate: dispatch_mux.Gate | None = None,
                       ) -> AsyncIterator[cpb.DispatchResponse]:
        self.calls.append((request.body, degraded, timeout))
        self.traces.append(trace)
        if request.body == b"missing":
            raise NotFound("model x is not served", reason="MODEL_NOT_FOUND")
        frames = [cpb.DispatchResponse(head=cpb.ResponseHead(http_status=200, request_id=request.request_id))]
        if request.body == b"big":
            frames += [cpb.DispatchResponse(chunk=bytes([i]) * 1000) for i in range(10)]
        for frame in frames:
            if gate is not None:
                await gate(frame)
            self.sent[request.body] = self.sent.get(request.body, 0) + 1
            yield frame
        if request.body == b"big":
            return
        if request.body == b"hang":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(request.body)
                raise
        yield cpb.DispatchResponse(chunk=request.body)


async def settle() -> None:
    """Let every task that can run, run (no I/O here: a fixed number of loop turns, no timing)."""
    for _ in range(50):
        await asyncio.sleep(0)


class Client:
    """The request side of the stream: messages put here reach the server; close() half-closes."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[cpb.DispatchManyRequest | None] = asyncio.Queue()

    def send(self, *commands: cpb.DispatchCommand) -> None:
        self.queue.put_nowait(cpb.DispatchManyRequest(commands=commands))

    def close(self) -> None:
        self.queue.put_nowait(None)

    async def requests(self) -> AsyncIterator[cpb.DispatchManyRequest]:
        while (msg := await self.queue.get()) is not None:
            yield msg


async def events(responses: AsyncIterator[cpb.DispatchManyResponse], n: int) -> list[cpb.DispatchEvent]:
    out: list[cpb.DispatchEvent] = []
    while len(out) < n:
        msg = await asyncio.wait_for(anext(responses), 5)
        assert msg.events, "no empty messages"
        out.extend(msg.events)
    return out


def by_request(evs: list[cpb.DispatchEvent]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for ev in evs:
        kind = ev.WhichOneof("kind")
        what = ev.frame.WhichOneof("frame") if kind == "frame" else kind
        out.setdefault(ev.stream_id, []).append(str(what))
    return out


async def test_each_request_gets_head_chunks_then_end_under_its_own_id() -> None:
    script, client = Script(), Client()
    responses = serve_stream(client.requests(), script)
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    client.send(start(1, b"one"), start(2, b"two", timeout_ms=1500, degraded=True, trace={"traceparent": parent}))
    evs = await events(responses, 6)
    assert by_request(evs) == {1: ["head", "chunk", "end"], 2: ["head", "chunk", "end"]}
    assert {ev.stream_id: ev.frame.chunk for ev in evs if ev.HasField("frame") and ev.frame.HasField("chunk")} == {
        1: b"one", 2: b"two"}
    assert sorted(script.calls) == [(b"one", False, None), (b"two", True, 1.5)]
    assert sorted(script.traces) == [(), (("traceparent", parent),)]  # each request's own context
    client.close()
    with pytest.raises(StopAsyncIteration):  # half-closed and nothing open: the stream ends
        await asyncio.wait_for(anext(responses), 5)


async def test_a_failed_request_gets_its_error_and_the_others_are_unaffected() -> None:
    script, client = Script(), Client()
    responses = serve_stream(client.requests(), script)
    client.send(start(7, b"missing"), start(8, b"fine"))
    evs = await events(responses, 4)
    assert by_request(evs) == {7: ["error"], 8: ["head", "chunk", "end"]}
    err = next(ev.error for ev in evs if ev.HasField("error"))
    assert (err.code, err.reason, err.message) == (5, "MODEL_NOT_FOUND", "model x is not served")  # 5 = NOT_FOUND
    client.close()


async def test_invalid_or_reused_stream_ids_fail_alone() -> None:
    script, client = Script(), Client()
    responses = serve_stream(client.requests(), script)
    client.send(start(3, b"hang"))
    evs = await events(responses, 1)  # its head: request 3 is open
    client.send(start(0), start(3, b"again"))
    evs = await events(responses, 2)
    assert [(ev.stream_id, ev.error.reason) for ev in evs] == [(0, "INVALID_STREAM_ID"), (3, "INVALID_STREAM_ID")]
    assert [c[0] for c in script.calls] == [b"hang"]  # neither reached Dispatch
    client.send(cpb.DispatchCommand(stream_id=3, cancel=True))
    client.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(responses), 5)
    assert script.cancelled == [b"hang"]


async def test_cancel_stops_one_request_and_sends_nothing_more_for_it() -> None:
    script, client = Script(), Client()
    responses = serve_stream(client.requests(), script)
    client.send(start(1, b"hang"), start(2, b"hang"))
    await events(responses, 2)  # both heads
    client.send(cpb.DispatchCommand(stream_id=1, cancel=True), start(3, b"after"))
    evs = await events(responses, 3)
    assert by_request(evs) == {3: ["head", "chunk", "end"]}
    assert script.cancelled == [b"hang"]
    await responses.aclose()  # the stream ends (client gone): the open request 2 is cancelled too
    assert script.cancelled == [b"hang", b"hang"]


async def test_waiting_events_go_out_in_one_message_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch_mux, "MAX_BATCH_EVENTS", 4)
    script, client = Script(), Client()
    responses = serve_stream(client.requests(), script)
    client.send(*(start(i, b"x") for i in range(1, 11)))  # 10 requests, 30 events, all ready at once
    sizes = []
    got = 0
    while got < 30:
        msg = await asyncio.wait_for(anext(responses), 5)
        sizes.append(len(msg.events))
        got += len(msg.events)
    assert max(sizes) == 4 and len(sizes) < 30  # batched, never beyond the bound
    client.close()


async def test_a_request_with_a_window_sends_only_what_was_credited_and_the_others_do_not_wait() -> None:
    """Flow control: head (64) + 1064 + 1064 bytes fit a 2,500-byte window, the next chunk may
    overdraw it (308 left), then the request waits for credit; another request is served meanwhile."""
    script, client = Script(), Client()
    responses = serve_stream(client.requests(), script)
    client.send(start(1, b"big", window=2500), start(2, b"small"))
    evs = await events(responses, 7)
    assert by_request(evs) == {1: ["head", "chunk", "chunk", "chunk"], 2: ["head", "chunk", "end"]}
    await settle()
    assert script.sent[b"big"] == 4  # nothing more got past the gate
    client.send(cpb.DispatchCommand(stream_id=1, credit=1064))  # still -756 + 1064 = 308 > 0: one more
    evs = await events(responses, 1)
    await settle()
    assert by_request(evs) == {1: ["chunk"]} and script.sent[b"big"] == 5
    client.send(cpb.DispatchCommand(stream_id=1, credit=100_000))
    evs = await events(responses, 7)
    assert by_request(evs) == {1: ["chunk"] * 6 + ["end"]}
    chunks = [ev.frame.chunk for ev in evs if ev.HasField("frame")]
    assert chunks == [bytes([i]) * 1000 for i in range(4, 10)]  # in order, nothing lost
    client.close()


async def test_credit_for_an_unknown_or_finished_request_is_ignored_and_no_window_means_only_the_streams_bound() -> None:
    script, client = Script(), Client()
    responses = serve_stream(client.requests(), script)
    client.send(cpb.DispatchCommand(stream_id=9, credit=10), start(1, b"big"))
    evs = await events(responses, 12)
    assert by_request(evs) == {1: ["head"] + ["chunk"] * 10 + ["end"]}
    client.send(cpb.DispatchCommand(stream_id=1, credit=10))
    client.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(responses), 5)


async def test_a_request_waiting_for_credit_is_cancelled_like_any_other() -> None:
    script, client = Script(), Client()
    responses = serve_stream(client.requests(), script)
    client.send(start(1, b"big", window=100))
    await events(responses, 2)  # head, one chunk (overdraft), then it waits
    client.send(cpb.DispatchCommand(stream_id=1, cancel=True), start(2, b"after"))
    evs = await events(responses, 3)
    assert by_request(evs) == {2: ["head", "chunk", "end"]}
    assert script.sent[b"big"] == 2
    client.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(responses), 5)


async def test_a_cancelled_id_can_be_reused_and_the_new_request_is_cancellable_and_counted() -> None:
    """The id of a cancelled request names the next request started under it: that one must be
    cancellable too (the first one's clean-up once removed it, leaving it to run to its deadline
    outside the open-request count), and must not receive the first one's frames still queued."""
    script, client = Script(), Client()
    responses = serve_stream(client.requests(), script)
    client.send(start(1, b"hang"))
    await events(responses, 1)  # its head went out
    client.send(start(2, b"hang"))
    await settle()  # request 2's head is queued, not yet taken by the stream
    client.send(cpb.DispatchCommand(stream_id=2, cancel=True), start(2, b"again"))
    await settle()
    evs = await events(responses, 3)
    assert by_request(evs) == {2: ["head", "chunk", "end"]}  # the new request's only: no stale head
    assert [ev.frame.chunk for ev in evs if ev.HasField("frame") and ev.frame.HasField("chunk")] == [b"again"]
    client.send(cpb.DispatchCommand(stream_id=1, cancel=True), start(1, b"hang"))
    await events(responses, 1)  # the new request 1's head
    client.send(cpb.DispatchCommand(stream_id=1, cancel=True))
    await settle()
    assert script.cancelled == [b"hang", b"hang", b"hang"]  # the reused id's request too
    client.close()
    with pytest.raises(StopAsyncIteration):  # nothing left open
        await asyncio.wait_for(anext(responses), 5)


async def test_requests_without_a_window_stop_at_the_streams_bound_while_the_client_does_not_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without windows, what waits for a client that does not read is bounded per stream (it was
    every answer in full): head 64 + 3 chunks of 1,064 overdraw a 3,000-byte room, then the
    request stops reading its engine until the stream takes the queued frames."""
    monkeypatch.setattr(dispatch_mux, "MAX_QUEUED_BYTES", 3000)
    script, client = Script(), Client()
    responses = serve_stream(client.requests(), script)
    client.send(start(1, b"big"))
    evs = await events(responses, 1)
    await settle()
    assert script.sent[b"big"] == 4  # head + 3 chunks, then it waits
    while len(evs) < 12:
        evs += await events(responses, 1)
    assert by_request(evs) == {1: ["head"] + ["chunk"] * 10 + ["end"]}
    assert [ev.frame.chunk for ev in evs if ev.HasField("frame") and ev.frame.HasField("chunk")] == [
        bytes([i]) * 1000 for i in range(10)]  # in order, nothing lost
    client.close()
