"""Real PD on real vLLM: a prefill and a decode vLLM 0.32 (CPU build) handing the KV over with
vLLM's NixlConnector (NIXL on CPU, DRAM buffers), managed by ``motor up``.

``motor up --config examples/fleet-real-vllm-cpu.yaml --union 0 --prefill 1 --decode 1``: the
nodemanagers launch ``kv_producer`` / ``kv_consumer`` engines, each with its own side channel and
its own core. Then, through gateway + coordinator with the ``openai`` SDK:

1. completion, chat, and both streamed — each equal to the same engine answering alone (the
   prefill engine without ``kv_transfer_params`` is a whole vLLM: the union run), greedy;
2. the decode's ``vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`` grew by the
   prompt tokens of those requests and ``vllm:nixl_bytes_transferred`` counted the transfers: the
   KV came over NIXL (the decode computed no prompt token itself);
3. the prefill's real ``kv_transfer_params`` have exactly the fields motor-sim produces, and the
   decode's real answers to a failed KV load (500, and the streamed error event) are what the
   coordinator's retry recognises (``kv_load_failed``) and what motor-sim answers;
4. the prefill paused (no prefill schedulable): the decode answers every request alone, with the
   same greedy answers, computing the prompt itself (``scheduler.decode_only_fallback``); resumed:
   PD over NIXL again;
5. SIGKILL of the decode's engine while requests are in flight → those requests, and every request
   until the decode is back, are answered whole by the prefill (``scheduler.prefill_only_fallback``:
   the same greedy text); the decode nodemanager reports the death, the controller relaunches it in
   place, and PD serving (over a new NIXL handshake) works again.

Start-up and relaunch times go to ``.real-engine/last-pd-run.json``. Needs ``scripts/real-engine-setup``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
from openai import AsyncOpenAI

from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as cgrpc
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as kpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as kgrpc
from motor_common.grpc_client import call_metadata, open_channel
from motor_coordinator.adapters.vllm import kv_load_failed
from tests.helpers import wait_for
from tests.realengine.test_fleet_real_vllm import (
    CONFIG,
    MODEL,
    MODEL_DIR,
    ROOT,
    UpFleet,
    _first_success,
    _nm_status,
    lane,
    motor_up,
)

PD = ("--union", "0", "--prefill", "1", "--decode", "1")
EXTERNAL = 'vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="external_kv_transfer"}'
LOCAL = 'vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="local_compute"}'
LOCAL_HIT = 'vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="local_cache_hit"}'
XFERS = 'vllm:nixl_bytes_transferred_count{engine="0",model_name="tiny"}'
SIM_KTP_KEYS = ["do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id",
                "remote_request_id", "remote_host", "remote_port", "tp_size", "dcp_size", "pp_size",
                "remote_num_tokens", "remote_blocks_expiry_time", "transfer_mode",
                "remote_prefill_cached_tokens"]  # fmt: skip

pytestmark = lane(900)


async def _engines(fleet: UpFleet, status: int = tpb.INSTANCE_STATUS_AVAILABLE) -> dict[str, str]:
    """The coordinator's instances of *status*: role name -> engine URL."""
    async with open_channel(fleet.info["coordinators"][0]) as ch:
        resp = await kgrpc.InstanceRegistryServiceStub(ch).ListInstances(
            kpb.ListInstancesRequest(page_size=100), metadata=call_metadata(fleet.key), timeout=5)
    out = {}
    for inst in resp.instances:
        if inst.status == status:
            [ep] = list(inst.endpoints)
            out[tpb.Role.Name(inst.role)] = f"http://{ep.ip}:{ep.business_port}"
    return out


async def _pair(fleet: UpFleet) -> bool:
    """Both the prefill and the decode available in the coordinator (until then one side may
    answer alone: scheduler.decode_only_fallback / prefill_only_fallback)."""
    return {"ROLE_PREFILL", "ROLE_DECODE"} <= set(await _engines(fleet))


async def _pause(fleet: UpFleet, node: str, pause: bool) -> None:
    """Pause (or resume) the instance *node* serves, through the controller, and wait until the
    coordinator's registry shows it."""
    async with open_channel(fleet.info["controller"]) as ch:
        admin = cgrpc.ControllerAdminServiceStub(ch)
        if pause:
            await admin.PauseInstance(cpb.PauseInstanceRequest(node_id=node, reason="test: no prefill"),
                                      metadata=call_metadata(fleet.key), timeout=60)
        else:
            await admin.ResumeInstance(cpb.ResumeInstanceRequest(node_id=node),
                                       metadata=call_metadata(fleet.key), timeout=60)  # the controller pushes to the coordinator
            # before answering: a box stalling for seconds (load 20+ beside the suite) took > 10 s

    async def shown() -> bool:
        async with open_channel(fleet.info["coordinators"][0]) as ch:
            resp = await kgrpc.InstanceRegistryServiceStub(ch).ListInstances(
                kpb.ListInstancesRequest(page_size=100), metadata=call_metadata(fleet.key), timeout=5)
        want = tpb.INSTANCE_STATUS_PAUSED if pause else tpb.INSTANCE_STATUS_AVAILABLE
        return any(i.role == tpb.ROLE_PREFILL and i.status == want for i in resp.instances)

    await wait_for(shown, timeout=20, interval=0.1, what=f"the prefill {'paused' if pause else 'resumed'}")


async def _metric(http: aiohttp.ClientSession, engine: str, name: str) -> float:
    async with http.get(engine + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
        text = await r.text()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    async with http.post(url, json=body, timeout=aiohttp.ClientTimeout(total=60)) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.read()


def _sse_text(raw: bytes, chat: bool) -> str:
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: {"):
            for ch in json.loads(line[6:]).get("choices", ()):
                out.append((ch.get("delta") or {}).get("content") or "" if chat else ch.get("text") or "")
    return "".join(out)


CMPL = {"model": MODEL, "prompt": "Hello, Motor. Disaggregated", "max_tokens": 6, "temperature": 0}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi there, decode"}], "max_tokens": 5,
        "temperature": 0}  # fmt: skip


_STEP = ["start", time.strftime("%H:%M:%S")]  # the request under way, and when it was sent: shown on a failure


def _step(name: str) -> None:
    _STEP[:] = [name, time.strftime("%H:%M:%S")]


async def _pd_equals_union(client: AsyncOpenAI, http: aiohttp.ClientSession, prefill: str) -> int:
    """Completion, chat, streamed completion, streamed chat through Motor (PD) against the prefill
    engine answering alone; returns the prompt tokens sent through the PD path."""
    _step("the prefill alone")
    _, _, raw = await _post(http, prefill + "/v1/completions", CMPL)
    alone = json.loads(raw)
    want_c, prompt_c = alone["choices"][0]["text"], alone["usage"]["prompt_tokens"]
    _, _, raw = await _post(http, prefill + "/v1/chat/completions", CHAT)
    alone = json.loads(raw)
    want_ch, prompt_ch = alone["choices"][0]["message"]["content"], alone["usage"]["prompt_tokens"]
    assert want_c and want_ch

    _step("PD completion")
    c = await client.completions.create(**CMPL)  # type: ignore[call-overload]
    assert c.choices[0].text == want_c and c.usage.prompt_tokens == prompt_c and c.usage.completion_tokens == 6
    assert (c.system_fingerprint or "").startswith("vllm-0.32")
    _step("PD chat")
    ch = await client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
    assert ch.choices[0].message.content == want_ch and ch.usage.prompt_tokens == prompt_ch

    text = []
    _step("PD streamed completion")
    async for chunk in await client.completions.create(**CMPL, stream=True):  # type: ignore[call-overload]
        text += [x.text for x in chunk.choices]
    assert "".join(text) == want_c
    text = []
    _step("PD streamed chat")
    async for chunk in await client.chat.completions.create(**CHAT, stream=True):  # type: ignore[call-overload]
        text += [x.delta.content or "" for x in chunk.choices]
    assert "".join(text) == want_ch
    return 2 * (prompt_c + prompt_ch)


async def _failed_load_shapes(http: aiohttp.ClientSession, decode: str, ktp: dict[str, Any]) -> None:
    """Real vLLM's answers to a KV load that fails (a peer nobody listens on: the NIXL handshake
    fails): what the coordinator's retry recognises."""
    bogus = dict(ktp, remote_engine_id="no-such-engine", remote_port=1, remote_request_id="gone")
    status, ctype, raw = await _post(http, decode + "/v1/completions", dict(CMPL, kv_transfer_params=bogus))
    assert status == 500 and kv_load_failed(status, ctype, raw) is True, (status, raw)
    assert json.loads(raw) == {"error": {"message": "Internal server error", "type": "InternalServerError",
                                         "param": None, "code": 500}}  # fmt: skip
    status, ctype, raw = await _post(http, decode + "/v1/chat/completions",
                                     dict(CHAT, stream=True, kv_transfer_params=bogus))
    assert status == 200 and kv_load_failed(status, ctype, raw) is True, raw
    assert raw.endswith(b'data: {"error": {"message": "Internal server error", "type": "InternalServerError", '
                        b'"param": null, "code": 500}}\n\ndata: [DONE]\n\n')


async def test_pd_on_real_vllm_over_nixl_equals_union_and_survives_a_killed_decode(tmp_path: Path) -> None:
    assert MODEL_DIR.is_dir(), "no .real-engine/tiny-llama: run scripts/real-engine-setup"
    t_lane = time.monotonic()
    # two vLLM processes start at once on 2 cores (shared with other work): a generous bound
    async with motor_up(tmp_path / "up", PD, timeout=480) as fleet, aiohttp.ClientSession() as http:
        client = AsyncOpenAI(base_url=fleet.gateway + "/v1", api_key="unused", max_retries=0, timeout=60.0)
        try:
            start_errors: list[str] = []
            await _first_success(client, 120, start_errors)
            await wait_for(lambda: _pair(fleet), timeout=120, interval=0.2, what="both engines available")
            startup_s = time.monotonic() - fleet.spawned_at
            engines = await _engines(fleet)
            prefill, decode = engines["ROLE_PREFILL"], engines["ROLE_DECODE"]
            # each engine its own log (they once shared engine-0.log) and its own core
            for node, core in (("prefill-0", "0"), ("decode-0", "1")):
                log = fleet.log(f"{node}.engine-0", 10**7)
                assert "NIXL is available" in log, log[-2000:]
                assert f"core ids=[{core}]" in log, log[-2000:]

            ext0, local0, xfer0 = [await _metric(http, decode, m) for m in (EXTERNAL, LOCAL, XFERS)]
            sent = await _pd_equals_union(client, http, prefill)
            ext1, local1, xfer1 = [await _metric(http, decode, m) for m in (EXTERNAL, LOCAL, XFERS)]
            assert ext1 - ext0 == sent, (ext0, ext1, sent)  # every prompt token came over NIXL
            assert local1 == local0  # the decode computed no prompt token itself
            assert xfer1 - xfer0 >= 4, (xfer0, xfer1)

            # the real producer's kv_transfer_params: the simulator's fields, in the same order
            _, _, raw = await _post(http, prefill + "/v1/completions", dict(CMPL, max_tokens=1, kv_transfer_params={
                "do_remote_decode": True, "do_remote_prefill": False}))
            ktp = json.loads(raw)["kv_transfer_params"]
            assert list(ktp) == SIM_KTP_KEYS, list(ktp)
            assert len(ktp["remote_block_ids"]) == 1 and ktp["transfer_mode"] == "pull"
            await _failed_load_shapes(http, decode, ktp)

            # --- the prefill paused: the decode answers alone (scheduler.decode_only_fallback) ---
            await _pause(fleet, "prefill-0", True)
            before = [await _metric(http, decode, m) for m in (EXTERNAL, LOCAL, LOCAL_HIT)]
            sent = await _pd_equals_union(client, http, prefill)  # the same greedy answers
            after = [await _metric(http, decode, m) for m in (EXTERNAL, LOCAL, LOCAL_HIT)]
            assert after[0] == before[0], (before, after)  # nothing came over NIXL
            assert (after[1] + after[2]) - (before[1] + before[2]) == sent, (before, after, sent)
            await _pause(fleet, "prefill-0", False)
            ext_r = await _metric(http, decode, EXTERNAL)
            sent = await _pd_equals_union(client, http, prefill)
            assert await _metric(http, decode, EXTERNAL) - ext_r == sent  # PD again

            # --- SIGKILL the decode engine under a few requests: the prefill answers them, and every
            # request until the decode is relaunched in place (scheduler.prefill_only_fallback) ----
            long_body = dict(CMPL, max_tokens=40)
            _, _, raw = await _post(http, prefill + "/v1/completions", long_body)
            want_long = json.loads(raw)["choices"][0]["text"]
            _, _, raw = await _post(http, prefill + "/v1/completions", CMPL)
            want_c = json.loads(raw)["choices"][0]["text"]
            status = await _nm_status(fleet, "decode-0")
            [ep] = list(status.endpoints)
            assert ep.status == tpb.ENDPOINT_STATUS_NORMAL and ep.pid > 0
            fleet.engine_pgids.add(ep.pid)
            old_pid = ep.pid
            _step("requests in flight on the killed decode")
            in_flight = [asyncio.ensure_future(client.completions.create(**long_body)) for _ in range(3)]
            t_kill = time.monotonic()
            os.kill(old_pid, signal.SIGKILL)
            outcomes = await asyncio.gather(*in_flight, return_exceptions=True)
            # the three answered whole by the prefill (or by the decode, if it finished first)
            assert [o.choices[0].text if not isinstance(o, BaseException) else repr(o)
                    for o in outcomes] == [want_long] * 3, outcomes  # fmt: skip
            served: list[float] = []
            failed: list[str] = []

            async def relaunched() -> bool:
                """One request (it must succeed: the prefill answers while the decode is down),
                then: is the decode relaunched in place and the controller's relaunch done?"""
                try:
                    c = await client.completions.create(**CMPL)  # type: ignore[call-overload]
                except Exception as exc:  # counted, asserted below
                    failed.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                else:
                    if c.choices[0].text == want_c:
                        served.append(time.monotonic())
                    else:
                        failed.append(f"wrong text {c.choices[0].text!r}")
                st = await _nm_status(fleet, "decode-0")
                [e] = list(st.endpoints)
                return (e.status == tpb.ENDPOINT_STATUS_NORMAL and e.pid != old_pid and st.relaunch_count == 1
                        and "strategy=engine_relaunch outcome=done" in fleet.log("controller", 10**7)
                        and await _pair(fleet))  # fmt: skip

            _step("requests while the decode is relaunched")
            try:
                # a request a second: enough to show the prefill answering meanwhile, without keeping
                # its core busy while the decode's vLLM starts beside it (and the rest of the suite)
                await wait_for(relaunched, timeout=480, interval=1.0, what="the decode relaunched in place")
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\n{fleet.diagnostics()}") from None
            relaunch_s = time.monotonic() - t_kill
            assert not failed, failed
            assert len(served) >= 2, served  # requests answered while the decode was down
            status = await _nm_status(fleet, "decode-0")
            [ep] = list(status.endpoints)
            fleet.engine_pgids.add(ep.pid)
            assert (await _engines(fleet))["ROLE_DECODE"] == decode  # in place: same endpoint
            ext2 = await _metric(http, decode, EXTERNAL)  # a new process: counters from 0
            sent = await _pd_equals_union(client, http, prefill)
            assert await _metric(http, decode, EXTERNAL) - ext2 == sent
        except BaseException:
            print(fleet.diagnostics())  # shown with the failure: what each process logged last
            logging.getLogger(__name__).error("fleet digest at the failure:\n%s\n[test] failed at %s, sent at %s",
                                              fleet.brief(), *_STEP)  # the last lines  # fmt: skip
            raise
        finally:
            await client.close()
        retries = fleet.log("coordinator", 10**7).count("hand-off retry")
    lane_s = time.monotonic() - t_lane
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "loadavg": os.getloadavg(),
        "command": f"motor up --config {CONFIG.relative_to(ROOT)} {' '.join(PD)}",
        "startup_s": round(startup_s, 1),
        "relaunch_s": round(relaunch_s, 1),
        "test_s": round(lane_s, 1),
        "in_flight_at_kill": [type(o).__name__ if isinstance(o, BaseException) else "ok" for o in outcomes],
        "answered_during_relaunch": len(served),
        "kv_load_retries_seen": retries,
    }
    with contextlib.suppress(OSError):
        (ROOT / ".real-engine" / "last-pd-run.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nreal vLLM PD (NIXL): start-up {startup_s:.1f} s; decode relaunch {relaunch_s:.1f} s; "
          f"test {lane_s:.1f} s; in flight at the kill {result['in_flight_at_kill']}; "
          f"hand-off retries {retries}")  # fmt: skip
