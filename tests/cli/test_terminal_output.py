"""Text a server sends never drives the operator's terminal: `motor` writes every control character
(ESC of an ANSI sequence, BEL, CR, DEL, C1) of what it prints as ``\\uXXXX``.

Real processes: the `motor` CLI against a real gRPC server speaking ControllerAdminService whose
node names, instance reasons, alarm messages and error details carry terminal escapes (a hostile or
impersonated controller, or a nodemanager's error text relayed in an instance's reason).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbg
from tests.conftest import tool

EVIL = "\x1b]0;owned\x07\x1b[2J\x1b[8m\r\x7f\x9b"
SHOWN = "\\u001b]0;owned\\u0007\\u001b[2J\\u001b[8m\\u000d\\u007f\\u009b"


class HostileController(pbg.ControllerAdminServiceServicer):
    async def ListNodes(
        self, request: pb.ListNodesRequest, context: object
    ) -> pb.ListNodesResponse:
        spec = pb.NodeSpec(node_id="n" + EVIL, job_name="job" + EVIL, role=tpb.ROLE_DECODE, ip="10.0.0.1",
                           admin_port=9300)  # fmt: skip
        return pb.ListNodesResponse(nodes=[pb.Node(spec=spec, state=pb.NODE_STATE_RUNNING)])

    async def ListInstances(
        self, request: pb.ListInstancesRequest, context: object
    ) -> pb.ListInstancesResponse:
        inst = tpb.Instance(
            id=7, role=tpb.ROLE_DECODE, job_name="job" + EVIL, model_name="m" + EVIL
        )
        return pb.ListInstancesResponse(
            instances=[
                pb.ManagedInstance(
                    instance=inst, state=pb.INSTANCE_STATE_ACTIVE, reason="recovery failed: " + EVIL
                )
            ]
        )

    async def ListAlarms(
        self, request: pb.ListAlarmsRequest, context: object
    ) -> pb.ListAlarmsResponse:
        return pb.ListAlarmsResponse(
            alarms=[pb.Alarm(kind=pb.ALARM_KIND_STORE_UNAVAILABLE, message="etcd" + EVIL)]
        )

    async def PauseInstance(
        self, request: pb.PauseInstanceRequest, context: grpc.aio.ServicerContext
    ) -> None:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "refused" + EVIL)


@pytest.fixture
async def controller() -> AsyncIterator[str]:
    server = grpc.aio.server()
    pbg.add_ControllerAdminServiceServicer_to_server(HostileController(), server)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(0)


async def motor(*args: str) -> tuple[int, bytes, bytes]:
    proc = await asyncio.create_subprocess_exec(tool("motor"), *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out, err


async def test_status_shows_server_names_reasons_and_alarms_with_control_characters_escaped(
    controller: str, tmp_path: object
) -> None:
    code, out, err = await motor("status", "--controller", controller, "--state-dir", str(tmp_path))
    assert code == 0, err
    for raw in (b"\x1b", b"\x07", b"\r", b"\x7f", "\x9b".encode()):
        assert raw not in out + err
    text = out.decode()
    assert f"n{SHOWN}" in text and f"job{SHOWN}" in text and f"recovery failed: {SHOWN}" in text
    assert f"store unavailable (etcd{SHOWN})" in text


async def test_status_json_stays_valid_json_holding_the_servers_exact_strings(
    controller: str, tmp_path: object
) -> None:
    code, out, err = await motor(
        "status", "--json", "--controller", controller, "--state-dir", str(tmp_path)
    )
    assert code == 0, err
    assert b"\x1b" not in out and "\x9b".encode() not in out
    view = json.loads(out)
    assert view["instances"][0]["reason"] == "recovery failed: " + EVIL
    assert view["nodes"][0]["job"] == "job" + EVIL


async def test_an_error_detail_from_the_server_is_printed_escaped(
    controller: str, tmp_path: object
) -> None:
    code, out, err = await motor(
        "pause", "7", "--controller", controller, "--state-dir", str(tmp_path)
    )
    assert code == 1
    assert b"\x1b" not in out + err
    assert err.decode() == f"error: FAILED_PRECONDITION: refused{SHOWN}\n"
