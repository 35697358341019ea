"""`motor up` gives every role its own key: a real fleet (coordinator, controller, two nodemanagers
with simulated engines, gateway) comes up with them (nodes register with their node keys, the
controller drives coordinator and nodemanagers with its operator key, the gateway dispatches with
its inference key), and each program's key opens only its own role's RPCs: cross-role calls are
refused with PERMISSION_DENIED (a key of another kind) or UNAUTHENTICATED (a key that program does
not know), with a message naming what is needed, and change nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import openai
import pytest
import pytest_asyncio

from motor_common.gen.motor.controller.v1 import controller_pb2 as ctlpb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as ctlgrpc
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as npb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2_grpc as ngrpc
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.grpc_server import error_reason
from tests.motor_up import UpFleet, motor_up

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

DENIED, UNAUTH = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[UpFleet]:
    async with motor_up(tmp_path_factory.mktemp("keys"), "--prefill", "1", "--decode", "1", "--zero-latency") as up:
        yield up


def key(fleet: UpFleet, who: str) -> str:
    if who == "operator":
        return Path(fleet.info["management_key_file"]).read_text().strip()
    if who == "application":
        return Path(fleet.info["inference_key_file"]).read_text().strip()
    return Path(fleet.info["keys"][who]).read_text().strip()


def node_address(fleet: UpFleet, name: str) -> str:
    return f"127.0.0.1:{fleet.info['programs'][name]['port']}"


async def refused(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value


async def registry_ids(fleet: UpFleet) -> list[int]:
    async with open_channel(fleet.info["coordinators"][0]) as ch:
        resp = await cgrpc.InstanceRegistryServiceStub(ch).ListInstances(
            cpb.ListInstancesRequest(), metadata=call_metadata(key(fleet, "operator")), timeout=10)
    return sorted(i.id for i in resp.instances)


async def test_every_program_has_its_own_key_and_none_holds_the_operators(fleet: UpFleet) -> None:
    keys = {who: key(fleet, who) for who in [*fleet.info["keys"], "operator", "application"]}
    assert set(fleet.info["keys"]) == {"coordinator", "controller", "prefill-0", "decode-0", "gateway"}
    assert len(set(keys.values())) == len(keys)  # all different
    for name in fleet.info["keys"]:
        config = (fleet.state / f"{name}.yaml").read_text()
        assert "management_key_file" not in config
        assert fleet.info["management_key_file"] not in config  # the operator's own key file
    # ... and the fleet works with them: a completion went gateway -> coordinator (gateway key) ->
    # engines the controller registered (node keys) and pushed (controller's operator key).
    client = openai.AsyncOpenAI(base_url=fleet.info["gateway_url"] + "/v1", api_key="unused", max_retries=0,
                                timeout=20)
    resp = await client.completions.create(model="tiny", prompt="Hello", max_tokens=4)
    assert resp.usage is not None and resp.usage.completion_tokens == 4
    assert len(await registry_ids(fleet)) == 2


async def test_the_gateways_key_cannot_call_admin_rpcs(fleet: UpFleet) -> None:
    gw = call_metadata(key(fleet, "gateway"))
    before = await registry_ids(fleet)
    async with open_channel(fleet.info["coordinators"][0]) as ch:
        registry = cgrpc.InstanceRegistryServiceStub(ch)
        err = await refused(registry.ListInstances(cpb.ListInstancesRequest(), metadata=gw, timeout=10))
        assert err.code() == DENIED and error_reason(err) == "CREDENTIAL_ROLE"
        assert err.details() == "key 'gateway' is an inference (API) key; InstanceRegistryService needs an operator key"
        err = await refused(registry.PauseInstances(cpb.PauseInstancesRequest(instance_ids=before), metadata=gw,
                                                    timeout=10))
        assert err.code() == DENIED and error_reason(err) == "CREDENTIAL_ROLE"
    assert await registry_ids(fleet) == before
    async with open_channel(fleet.info["controller"]) as ch:
        err = await refused(ctlgrpc.ControllerAdminServiceStub(ch).ListInstances(
            ctlpb.ListInstancesRequest(), metadata=gw, timeout=10))
        assert err.code() == UNAUTH and error_reason(err) == "MANAGEMENT_KEY_REQUIRED"
        assert "ControllerAdminService needs an operator key" in (err.details() or "")
    async with open_channel(node_address(fleet, "prefill-0")) as ch:
        err = await refused(ngrpc.NodeManagerServiceStub(ch).PauseNode(npb.PauseNodeRequest(), metadata=gw,
                                                                       timeout=10))
        assert err.code() == UNAUTH and "NodeManagerService needs an operator key" in (err.details() or "")


async def test_a_node_key_opens_only_the_controllers_node_service(fleet: UpFleet) -> None:
    node = call_metadata(key(fleet, "prefill-0"))
    async with open_channel(fleet.info["controller"]) as ch:
        err = await refused(ctlgrpc.ControllerAdminServiceStub(ch).ListNodes(
            ctlpb.ListNodesRequest(), metadata=node, timeout=10))
        assert err.code() == DENIED and error_reason(err) == "CREDENTIAL_ROLE"
        assert err.details() == "key 'prefill-0' is a node key; ControllerAdminService needs an operator key"
    async with open_channel(node_address(fleet, "decode-0")) as ch:  # another node's admin port
        err = await refused(ngrpc.NodeManagerServiceStub(ch).GetStatus(npb.GetStatusRequest(), metadata=node,
                                                                       timeout=10))
        assert err.code() == UNAUTH
    async with open_channel(fleet.info["coordinators"][0]) as ch:
        err = await refused(cgrpc.InstanceRegistryServiceStub(ch).ListInstances(
            cpb.ListInstancesRequest(), metadata=node, timeout=10))
        assert err.code() == UNAUTH
        err = await refused(_dispatch(cgrpc.DispatchServiceStub(ch), node))
        assert err.code() == UNAUTH and "DispatchService needs an inference (API) key" in (err.details() or "")


async def test_the_controllers_operator_key_cannot_act_as_a_node(fleet: UpFleet) -> None:
    ctl = call_metadata(key(fleet, "controller"))
    async with open_channel(fleet.info["controller"]) as ch:
        err = await refused(ctlgrpc.ControllerServiceStub(ch).RegisterNode(
            ctlpb.RegisterNodeRequest(), metadata=ctl, timeout=10))
        assert err.code() == DENIED
        assert err.details() == "key 'controller' is an operator key; ControllerService needs a node key"


async def _dispatch(stub: cgrpc.DispatchServiceStub, metadata: tuple[tuple[str, str], ...]) -> list[cpb.DispatchResponse]:
    body = b'{"model": "tiny", "prompt": "Hi", "max_tokens": 2}'
    call = stub.Dispatch(cpb.DispatchRequest(request_id="keys-test", api=cpb.OPEN_AI_API_COMPLETIONS, body=body),
                         metadata=metadata, timeout=20)
    return [frame async for frame in call]


async def test_dispatch_takes_inference_keys_only(fleet: UpFleet) -> None:
    async with open_channel(fleet.info["coordinators"][0]) as ch:
        stub = cgrpc.DispatchServiceStub(ch)
        err = await refused(_dispatch(stub, call_metadata(key(fleet, "operator"))))
        assert err.code() == DENIED
        assert err.details() == "key 'operator' is an operator key; DispatchService needs an inference (API) key"
        err = await refused(_dispatch(stub, call_metadata()))
        assert err.code() == UNAUTH and "authorization: Bearer" in (err.details() or "")
        frames = await _dispatch(stub, (("authorization", f"Bearer {key(fleet, 'application')}"),))
        assert frames[0].head.http_status == 200
