"""Push targets: only configured coordinators and the master announced in the current term.

A real ``motor-controller`` (embedded store, resumed across runs), real in-process coordinators, and a
stand-in gRPC server that counts every call it receives (and whether it carried the management key).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from motor_common.gen.motor.controller.v1 import controller_pb2 as ctlpb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as ctlgrpc
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.grpc_server import ServerConfig, error_reason
from motor_coordinator.app import Coordinator
from motor_coordinator.config import CoordinatorConfig, DispatchConfig
from tests.controller.fakes import KEY
from tests.helpers import free_port, wait_for
from tests.procs import start_controller

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

CONFIG = {"heartbeat_interval_sec": 0.1, "heartbeat_timeout_sec": 0.6, "reconcile_interval_sec": 0.1,
          "sync_interval_sec": 0.2, "set_retry_interval_sec": 0.2}


class CallCounter(grpc.GenericRpcHandler):
    """Answers UNIMPLEMENTED to everything and remembers (method, carried the key)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def service(self, details: grpc.HandlerCallDetails) -> None:
        md = dict(details.invocation_metadata or ())
        self.calls.append((details.method, md.get("x-motor-management-key") == KEY))
        return None


@asynccontextmanager
async def stand_in(port: int) -> AsyncIterator[CallCounter]:
    counter = CallCounter()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((counter,))
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    await server.start()
    try:
        yield counter
    finally:
        await server.stop(0)


@asynccontextmanager
async def coordinator() -> AsyncIterator[Coordinator]:
    cfg = CoordinatorConfig(server=ServerConfig(port=0),
                            dispatch=DispatchConfig(health_probe_interval_sec=0, metrics_scrape_interval_sec=0))
    app = Coordinator(cfg, management_key=KEY)
    await app.start()
    try:
        yield app
    finally:
        await app.stop(0)


def list_calls() -> float:
    """ListInstances calls answered by the in-process coordinators so far (the pusher's sync check)."""
    value = REGISTRY.get_sample_value("motor_grpc_server_handled_total", {
        "service": "motor.coordinator.v1.InstanceRegistryService", "method": "ListInstances", "code": "OK"})
    return value or 0.0


async def test_a_coordinator_address_of_an_earlier_run_never_gets_a_call(tmp_path: Path) -> None:
    # run 1: the controller pushes to coordinator A (its generation is persisted under A's address)
    async with coordinator() as a:
        old_port = int(a.address.rsplit(":", 1)[1])
        async with start_controller(tmp_path, {**CONFIG, "coordinators": [a.address]}, management_key=KEY,
                                    name="ctl"):
            await wait_for(lambda: a.state.authoritative, timeout=20, what="first SET to coordinator A")
    # run 2, same store, configured with coordinator B only; a stand-in listens on A's old port
    async with stand_in(old_port) as old, coordinator() as b:
        async with start_controller(tmp_path, {**CONFIG, "coordinators": [b.address]}, management_key=KEY,
                                    name="ctl") as ctl:
            await wait_for(lambda: b.state.authoritative, timeout=20, what="first SET to coordinator B")
            # several sync rounds of the controller (every 0.2 s) have reached B ...
            seen = list_calls()
            await wait_for(lambda: list_calls() >= seen + 5, timeout=20, what="5 more sync rounds on B")
            # ... and not one call reached the stale address, with or without the key
            assert old.calls == []
            assert "dropped stale coordinator addresses" in ctl.log()


async def test_a_node_key_cannot_make_the_controller_send_its_key_to_an_address_of_its_choosing(
        tmp_path: Path) -> None:
    """ReportAlarm(COORDINATOR_PROMOTED) needs only a node key (every nodemanager has one). The
    announced address becomes a push target, which receives the operator key, only when a
    configured coordinator confirms it is master there; a stand-in announcing itself gets nothing."""
    async with coordinator() as a:
        port = free_port()
        async with stand_in(port) as rogue, start_controller(
                tmp_path, {**CONFIG, "coordinators": [a.address]}, management_key=KEY, name="ctl") as ctl:
            await wait_for(lambda: a.state.authoritative, timeout=20, what="first SET to coordinator A")
            channel = open_channel(ctl.address)
            stub = ctlgrpc.ControllerServiceStub(channel)
            rogue_address = f"127.0.0.1:{port}"
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ReportAlarm(ctlpb.ReportAlarmRequest(alarm=ctlpb.Alarm(
                    kind=ctlpb.ALARM_KIND_COORDINATOR_PROMOTED, action=ctlpb.ALARM_ACTION_RAISE,
                    source=f"coordinator@{rogue_address}", address=rogue_address)),
                    metadata=call_metadata(KEY), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert error_reason(err.value) == "PROMOTION_NOT_CONFIRMED"
            # refused before anything happened: no alarm stored, no target added
            alarms = ctlgrpc.ControllerAdminServiceStub(channel)
            listed = await alarms.ListAlarms(ctlpb.ListAlarmsRequest(active_only=True),
                                             metadata=call_metadata(KEY), timeout=10)
            assert list(listed.alarms) == []
            seen = list_calls()
            await wait_for(lambda: list_calls() >= seen + 3, timeout=20, what="3 more sync rounds on A")
            assert rogue.calls == []  # not one call, with or without the key
            await channel.close()
