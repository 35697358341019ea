"""The engine-publisher fault reporter: pure decisions, real ZMQ sockets in-process, and the real
nodemanager subscribed to a motor-sim engine's vllm_fault publisher."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson
import pytest
import zmq
import zmq.asyncio

from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as pb
from motor_common.grpc_server import GrpcServer
from motor_nodemanager.controller_client import FaultLevel
from motor_nodemanager.detail import MAX_DETAIL
from motor_nodemanager.fault_reporter import TOPIC, FaultReporter, decide, parse
from tests.helpers import free_port, wait_for
from tests.nodemanager.conftest import Admin, nm_config
from tests.nodemanager.fake_controller import FakeController
from tests.nodemanager.test_nodemanager_process import all_normal, registered, start_request
from tests.procs import start_nodemanager

Ctl = tuple[GrpcServer, FakeController]


def msg(status: str) -> list[bytes]:
    return [TOPIC, orjson.dumps({"status": status, "reason": "r", "dp_rank": 0})]


def test_parse_and_decide() -> None:
    assert parse(msg("dead")) == ("dead", "r")
    assert parse([b"other", b"{}"]) is None and parse([TOPIC, b"not json"]) is None
    assert parse([TOPIC, b'{"status": "weird"}']) is None
    assert decide(None, "healthy") is None
    assert decide(None, "unhealthy") is FaultLevel.ENGINE_UNHEALTHY
    assert decide("unhealthy", "unhealthy") is None
    assert decide("unhealthy", "dead") is FaultLevel.ENGINE_DEAD
    assert decide("dead", "dead") is None


async def test_a_long_publisher_reason_is_sent_clipped() -> None:
    details: list[str] = []

    async def send(eid: int, level: FaultLevel, detail: str) -> bool:
        details.append(detail)
        return True

    rep = FaultReporter(lambda: "127.0.0.1", lambda: None, send, lambda: 0.05)
    try:
        reason = "Traceback:\n" + "x" * 5000 + "\nValueError: boom"
        await rep._on_message(0, [TOPIC, orjson.dumps({"status": "dead", "reason": reason})])
        assert len(details) == 1 and len(details[0]) <= MAX_DETAIL
        assert details[0].startswith("engine publisher: dead: Traceback:") and details[0].endswith("ValueError: boom")
    finally:
        await rep.close()


async def test_reports_each_state_once_after_acceptance_and_pause_resets_it() -> None:
    port = free_port()
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(f"tcp://127.0.0.1:{port}")
    sent: list[tuple[int, FaultLevel]] = []
    accept = [False]

    async def send(eid: int, level: FaultLevel, detail: str) -> bool:
        sent.append((eid, level))
        return accept[0]

    rep = FaultReporter(lambda: "127.0.0.1", lambda: port, send, lambda: 0.05)
    rep.watch([0])

    async def publish_until(cond: object, status: str) -> None:
        async def step() -> bool:
            await pub.send_multipart(msg(status))
            return bool(cond())  # type: ignore[operator]

        await wait_for(step, timeout=5, interval=0.02, what=f"reporter to see {status}")

    try:
        await publish_until(lambda: rep.messages > 0, "healthy")
        assert sent == []
        await publish_until(lambda: len(sent) >= 2, "unhealthy")  # refused: tried again
        accept[0] = True
        await publish_until(lambda: rep.reported.get(0) == "unhealthy", "unhealthy")
        n = len(sent)
        await publish_until(lambda: rep.messages > 20, "unhealthy")
        assert len(sent) == n  # reported once
        await publish_until(lambda: rep.reported.get(0) == "dead", "dead")
        assert sent[-1] == (0, FaultLevel.ENGINE_DEAD)
        rep.pause()
        assert rep.subscribed == []
        rep.resume(reset=True)
        assert rep.reported == {} and rep.subscribed == [0]
    finally:
        await rep.close()
        pub.close(0)
        ctx.term()


@pytest.mark.slow
async def test_nodemanager_reports_what_the_engine_publishes(tmp_path: Path, controller: Ctl, key_file: str) -> None:
    server, impl = controller
    cfg = nm_config(server.port, key_file, tmp_path, endpoints_per_node=1,
                    fault_tolerance_config={"enable_fault_tolerance": True, "zmq_pub_port": free_port(),
                                            "zmq_retry_interval_sec": 0.2})  # fmt: skip
    cfg["engine"]["extra_args"] = ["--sim-zmq-interval-s", "0.1"]
    nm = await start_nodemanager(tmp_path, cfg)
    admin = Admin(nm.address)
    try:
        spec = await registered(impl)
        await admin.call("StartEngines", start_request(spec))
        await wait_for(lambda: all_normal(admin), timeout=20, what="NORMAL")
        port = spec.endpoints[0].business_port
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://127.0.0.1:{port}/sim/fault", json={"mode": "health_503"}) as r:
                assert r.status == 200
        await wait_for(lambda: [f for f in impl.faults if f.source == cpb.FAULT_SOURCE_ENGINE_PUBLISHER],
                       timeout=10, what="engine-publisher report")  # fmt: skip
        pub = [f for f in impl.faults if f.source == cpb.FAULT_SOURCE_ENGINE_PUBLISHER]
        assert pub[0].level == cpb.FAULT_LEVEL_ENGINE_UNHEALTHY
        # relaunch: the reporter is paused, then resumes with a reset state
        await admin.call("RestartEngine", pb.RestartEngineRequest(action=pb.RESTART_ACTION_RESTART))
        await wait_for(lambda: all_normal(admin), timeout=20, what="NORMAL after relaunch")
        assert "fault reporter subscribed" in nm.log_text()
    finally:
        await admin.close()
        assert nm.terminate() == 0
