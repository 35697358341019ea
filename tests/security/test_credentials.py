"""Credentials on a real fleet (tests/security/conftest.py): every protected method refuses a call
without a key, with an unknown key and with another role's key, and changes nothing; operator
mutations are audited; inference needs a credential on every route once one is configured; key
files are rotated without a restart.
"""

from __future__ import annotations

import aiohttp
import grpc
import openai
import pytest
import yaml

from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbg
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as npb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2_grpc as npbg
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.grpc_server import error_reason
from tests.grpc_methods import Method, methods
from tests.helpers import wait_for
from tests.security.conftest import KEYS, SecuredFleet, digest

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

OPERATOR_SERVICES = {"motor.controller.v1.ControllerAdminService", "motor.coordinator.v1.InstanceRegistryService",
                     "motor.nodemanager.v1.NodeManagerService", "motor.nodemanager.v1.ScaleDownService"}
NODE_SERVICES = {"motor.controller.v1.ControllerService"}
INFERENCE_METHODS = {"motor.coordinator.v1.DispatchService/Dispatch", "motor.coordinator.v1.DispatchService/ListModels"}


# A key of another kind that the program knows (→ PERMISSION_DENIED); the nodemanager knows only
# operator keys, so a node key is an unknown credential there (→ UNAUTHENTICATED).
OTHER = {("controller", "operator"): KEYS["fleet-nodes"], ("controller", "node"): KEYS["alice"],
         ("coordinator", "operator"): KEYS["app-a"], ("coordinator", "inference"): KEYS["alice"],
         ("nodemanager", "operator"): KEYS["fleet-nodes"]}


def _protected() -> list[tuple[Method, str, str]]:
    """(method, the key kind it needs, a key of another kind)."""
    out = []
    for program in ("controller", "coordinator", "nodemanager"):
        for m in methods(program):
            if m.service in OPERATOR_SERVICES:
                kind = "operator"
            elif m.service in NODE_SERVICES:
                kind = "node"
            elif f"{m.service}/{m.name}" in INFERENCE_METHODS:
                kind = "inference"
            else:
                continue
            out.append((m, kind, OTHER[program, kind]))
    return out


async def _state(fleet: SecuredFleet) -> tuple[bytes, ...]:
    """What a refused call must not change: the controller's nodes and instances, the
    coordinator's instances, the nodemanager's status (serialized)."""
    md = call_metadata(KEYS["alice"])
    async with open_channel(fleet.controller.address) as ch:
        admin = pbg.ControllerAdminServiceStub(ch)
        nodes = await admin.ListNodes(pb.ListNodesRequest(), metadata=md, timeout=5)
        insts = await admin.ListInstances(pb.ListInstancesRequest(), metadata=md, timeout=5)
    async with open_channel(fleet.coordinator.address) as ch:
        reg = await cgrpc.InstanceRegistryServiceStub(ch).ListInstances(
            cpb.ListInstancesRequest(), metadata=md, timeout=5)
    for n in nodes.nodes:
        n.ClearField("last_heartbeat_at")
    return (nodes.SerializeToString(deterministic=True), insts.SerializeToString(deterministic=True),
            reg.SerializeToString(deterministic=True))


def _md(kind: str, key: str) -> tuple[tuple[str, str], ...]:
    if kind == "inference":
        return (("authorization", f"Bearer {key}"),)
    return call_metadata(key)


async def test_every_protected_method_refuses_missing_wrong_and_other_role_keys(secured: SecuredFleet) -> None:
    before = await _state(secured)
    checked = 0
    for m, kind, other in _protected():
        async with open_channel(secured.address(m.program)) as ch:
            for what, md, code in (
                ("no key", (), grpc.StatusCode.UNAUTHENTICATED),
                ("wrong key", _md(kind, "not-a-key-0000000"), grpc.StatusCode.UNAUTHENTICATED),
                ("other role's key", _md(kind, other),
                 grpc.StatusCode.UNAUTHENTICATED if m.program == "nodemanager" else grpc.StatusCode.PERMISSION_DENIED),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await m.call(ch, m.request_class(), md)
                assert err.value.code() == code, f"{m.id} with {what}: {err.value.code()} {err.value.details()}"
                reason = error_reason(err.value)
                assert reason in ("MANAGEMENT_KEY_REQUIRED", "CREDENTIAL_ROLE"), (m.id, what, reason)
                if code == grpc.StatusCode.PERMISSION_DENIED:
                    assert f"needs an {kind}" in (err.value.details() or "") or f"needs a {kind}" in (
                        err.value.details() or ""), err.value.details()
                checked += 1
    assert checked == 3 * len(_protected()) and len(_protected()) >= 25
    assert await _state(secured) == before


async def test_the_right_key_gets_past_authentication(secured: SecuredFleet) -> None:
    """With the right kind of key no protected method answers UNAUTHENTICATED/PERMISSION_DENIED
    (an empty request is then refused by validation, or served)."""
    for m, kind, _ in _protected():
        if m.name in ("StopNode", "Heartbeat", "SetInstances") or m.service.endswith("ScaleDownService"):
            continue  # would stop the node / a long-lived stream / empty set = clear all / leases
        key = {"operator": KEYS["alice"], "node": KEYS["fleet-nodes"], "inference": KEYS["app-a"]}[kind]
        async with open_channel(secured.address(m.program)) as ch:
            try:
                await m.call(ch, m.request_class(), _md(kind, key))
            except grpc.aio.AioRpcError as exc:
                assert exc.code() not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED), m.id


async def test_operator_mutations_are_audited_with_who_what_and_request_id(secured: SecuredFleet) -> None:
    async with open_channel(secured.coordinator.address) as ch:
        reg = cgrpc.InstanceRegistryServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError):
            await reg.PauseInstances(cpb.PauseInstancesRequest(instance_ids=[987654]),
                                      metadata=call_metadata(KEYS["alice"], "audit-rid-1"), timeout=5)
        await reg.ListInstances(cpb.ListInstancesRequest(), metadata=call_metadata(KEYS["alice"], "audit-rid-2"),
                                timeout=5)
    await wait_for(lambda: "request_id=audit-rid-1" in secured.log("coordinator"), timeout=5, what="audit line")
    line = next(ln for ln in secured.log("coordinator").splitlines() if "request_id=audit-rid-1" in ln)
    assert "audit: alice InstanceRegistryService/PauseInstances" in line and "result=" in line
    assert "audit-rid-2" not in secured.log("coordinator").split("audit:")[-1]  # reads are not audited
    # The controller's own pushes are audited under its name on the coordinator.
    assert "audit: controller InstanceRegistryService/" in secured.log("coordinator")


async def test_inference_needs_a_credential_on_every_route(secured: SecuredFleet) -> None:
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    gateway, front = secured.gateway.url, f"http://127.0.0.1:{secured.coordinator.ports['http']}"
    async with aiohttp.ClientSession() as http:
        for base in (gateway, front):
            for method, path in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                                 ("GET", "/v1/models")):
                for auth in (None, "Bearer nope-0000000000", f"Bearer {KEYS['alice']}", f"Bearer {KEYS['gateway']}"):
                    headers = {"Authorization": auth} if auth else {}
                    if base == front and auth == f"Bearer {KEYS['gateway']}":
                        continue  # the front accepts the api_keys file only; 'gateway' is not in it
                    async with http.request(method, base + path, json=body, headers=headers) as resp:
                        assert resp.status == 401, (base, path, auth, resp.status)
                        err = (await resp.json())["error"]
                        assert err["type"] == "authentication_error"
    # gRPC Dispatch straight to the coordinator port.
    async with open_channel(secured.coordinator.address) as ch:
        stub = cgrpc.DispatchServiceStub(ch)
        req = cpb.DispatchRequest(api=cpb.OPEN_AI_API_COMPLETIONS, body=b'{"model":"tiny","prompt":"x","max_tokens":2}')
        for md in ((), (("authorization", "Bearer nope-0000000000"),), call_metadata(KEYS["alice"])):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in stub.Dispatch(req, metadata=md, timeout=5):
                    pass
            assert err.value.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
        frames = [f async for f in stub.Dispatch(req, metadata=(("authorization", f"Bearer {KEYS['app-b']}"),),
                                                 timeout=10)]
        assert frames[0].head.http_status == 200
        # Readiness stays open for the gateways' probes.
        assert (await stub.GetReadiness(cpb.GetReadinessRequest(), timeout=5)).ready


async def test_named_api_keys_serve_and_rotate_without_restart(secured: SecuredFleet) -> None:
    def client(key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=secured.gateway.url + "/v1", api_key=key, max_retries=0, timeout=10)

    for name in ("app-a", "app-b"):
        resp = await client(KEYS[name]).completions.create(model="tiny", prompt="hello", max_tokens=2)
        assert resp.usage is not None and resp.usage.completion_tokens == 2
    with pytest.raises(openai.AuthenticationError):
        await client("unknown-key-000000").completions.create(model="tiny", prompt="x", max_tokens=1)

    # Rotate: app-b is replaced by app-c in the gateway's and the coordinator's files.
    new = "inf-app-c-0123456789"
    api_keys = secured.files["api_keys"]
    api_keys.write_text(yaml.safe_dump({"app-a": KEYS["app-a"], "app-c": new}))
    inference = secured.files["inference"]
    inference.write_text(yaml.safe_dump({"app-a": KEYS["app-a"], "app-c": new, "gateway": KEYS["gateway"]}))

    async def rotated() -> bool:
        try:
            await client(new).completions.create(model="tiny", prompt="x", max_tokens=1)
        except openai.AuthenticationError:
            return False
        return True

    await wait_for(rotated, timeout=10, what="the new key accepted")
    with pytest.raises(openai.AuthenticationError):
        await client(KEYS["app-b"]).completions.create(model="tiny", prompt="x", max_tokens=1)
    # the coordinator re-reads its own file on its own schedule (at most every 0.5 s): the gateway
    # taking the new key says nothing about it (the gateway presents its own key to it)
    async with open_channel(secured.coordinator.address) as ch:
        async def coordinator_takes_it() -> list[str] | None:
            try:
                models = await cgrpc.DispatchServiceStub(ch).ListModels(
                    cpb.ListModelsRequest(), metadata=(("authorization", f"Bearer {new}"),), timeout=5)
            except grpc.aio.AioRpcError as exc:
                if exc.code() is not grpc.StatusCode.UNAUTHENTICATED:
                    raise
                return None
            return [m.id for m in models.models]

        assert await wait_for(coordinator_takes_it, timeout=10, what="the coordinator to take the new key") == ["tiny"]


async def test_the_keys_programs_present_rotate_without_restart(secured: SecuredFleet) -> None:
    """The controller's operator key (auth.key_file) and the gateway's coordinator key are re-read
    when their files change: after a rotation that removes the old keys from the accepting side,
    the controller's pushes and the gateway's calls go on (they kept the start-up key before)."""
    md = call_metadata(KEYS["alice"])
    new_ctl, new_gw = "op-controller-rotated-01", "inf-gateway-rotated-01"
    secured.files["operators"].write_text(yaml.safe_dump({"alice": KEYS["alice"], "controller": new_ctl}))
    secured.files["controller_key"].write_text(new_ctl)
    inference = yaml.safe_load(secured.files["inference"].read_text())
    secured.files["inference"].write_text(yaml.safe_dump({**inference, "gateway": new_gw}))
    secured.files["gateway_key"].write_text(new_gw)

    async with open_channel(secured.controller.address) as ctl_ch, open_channel(secured.coordinator.address) as co_ch:
        # First the accepting side: once the coordinator refuses both old keys, a call that works
        # can only have presented a new one (both sides re-read their files at most every 0.5 s).
        async def old_keys_refused() -> bool:
            for call in (cgrpc.InstanceRegistryServiceStub(co_ch).ListInstances(
                             cpb.ListInstancesRequest(), metadata=call_metadata(KEYS["controller"]), timeout=5),
                         cgrpc.DispatchServiceStub(co_ch).ListModels(
                             cpb.ListModelsRequest(), metadata=(("authorization", f"Bearer {KEYS['gateway']}"),),
                             timeout=5)):
                try:
                    await call
                    return False
                except grpc.aio.AioRpcError as exc:
                    if exc.code() is not grpc.StatusCode.UNAUTHENTICATED:
                        raise
            return True

        await wait_for(old_keys_refused, timeout=10, what="the coordinator refusing the old keys")
        admin = pbg.ControllerAdminServiceStub(ctl_ch)
        iid = (await admin.ListInstances(pb.ListInstancesRequest(), metadata=md, timeout=5)).instances[0].instance.id
        registry = cgrpc.InstanceRegistryServiceStub(co_ch)

        async def coordinator_shows(status: int) -> bool:
            resp = await registry.ListInstances(cpb.ListInstancesRequest(), metadata=md, timeout=5)
            return [i.status for i in resp.instances] == [status]

        # a pause reaches the coordinator only through a push made with the controller's new key
        await admin.PauseInstance(pb.PauseInstanceRequest(instance_id=iid, reason="rotation"), metadata=md, timeout=5)
        await wait_for(lambda: coordinator_shows(tpb.INSTANCE_STATUS_PAUSED), timeout=20,
                       what="the controller's push with its rotated key")
        await admin.ResumeInstance(pb.ResumeInstanceRequest(instance_id=iid), metadata=md, timeout=5)
        await wait_for(lambda: coordinator_shows(tpb.INSTANCE_STATUS_AVAILABLE), timeout=20, what="resumed")
    assert "op-controller-0123456789" not in secured.files["operators"].read_text()

    async def models_listed() -> bool:  # ListModels: a call per request with the gateway's own key
        async with aiohttp.ClientSession() as http, http.get(
                secured.gateway.url + "/v1/models", headers={"Authorization": f"Bearer {KEYS['app-a']}"}) as resp:
            return resp.status == 200 and [m["id"] for m in (await resp.json())["data"]] == ["tiny"]

    await wait_for(models_listed, timeout=20, what="the gateway presenting its rotated key")
    assert "reloaded" in secured.log("gateway") and "auth.key_file reloaded" in secured.log("controller")


async def test_a_nodemanager_accepts_keys_from_a_file_of_digests_that_holds_none_of_them(secured: SecuredFleet) -> None:
    """The nodemanager's operator keys are digests only: the controller drove it to ACTIVE with its
    key (the fixture), a person's key works, and neither the keys nor a digest presented as a key
    get anything from the file."""
    text = secured.files["nm_operators"].read_text()
    assert KEYS["alice"] not in text and KEYS["controller"] not in text and text.count("sha256:") == 2
    async with open_channel(secured.nodemanager.address) as ch:
        stub = npbg.NodeManagerServiceStub(ch)
        status = await stub.GetStatus(npb.GetStatusRequest(), metadata=call_metadata(KEYS["alice"]), timeout=5)
        assert status.node_id
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetStatus(npb.GetStatusRequest(), metadata=call_metadata(digest(KEYS["alice"])), timeout=5)
        assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
