"""A managed Motor fleet whose union instance is a real vLLM 0.32 CPU process.

``motor up --config examples/fleet-real-vllm-cpu.yaml --union 1 --prefill 0 --decode 0`` runs the
real controller, coordinator, gateway and one nodemanager; the nodemanager launches vLLM through
``scripts/real-vllm serve`` with its usual vLLM flags. Then, through gateway + coordinator with the
``openai`` SDK: completion, chat, streaming; the least-load gauges the coordinator scrapes from the
engine's ``/metrics``; SIGKILL of the engine pid (from the nodemanager's GetStatus) → the
nodemanager reports the death, the controller's engine-relaunch strategy relaunches it in place →
requests succeed again. Prints start-up (spawn → first 200 through the gateway) and relaunch
(kill → first 200) times and writes them to ``.real-engine/last-fleet-run.json``.

Before the kill, the same engine serves the pass-through routes through the gateway with the
``openai`` SDK (``_passthrough_routes``): ``/tokenize``, ``/detokenize``, ``/version``, the engine's
``/v1/models`` card, ``/v1/responses`` (plain, streamed, stored + retrieved, background +
cancelled, unknown id) and ``/v1/embeddings`` (not served by a generation model: vLLM's own 404,
relayed in OpenAI's error shape). The engine runs with ``VLLM_ENABLE_RESPONSES_API_STORE=1``.

Needs ``scripts/real-engine-setup``; skips only when ``.real-engine/venv`` is absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml
from openai import AsyncOpenAI

from motor_common.domain import EngineType
from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as kpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as kgrpc
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as npb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2_grpc as ngrpc
from motor_common.grpc_client import call_metadata, open_channel
from motor_coordinator.monitor import parse_load
from tests.conftest import tool
from tests.helpers import wait_for
from tests.realengine.test_vllm_vs_simulator import MODEL_DIR, ROOT, lane

CONFIG = ROOT / "examples" / "fleet-real-vllm-cpu.yaml"
MODEL = "tiny"
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
# vLLM CPU start-up is ~30-60 s on this 2-core machine, 4-5 min when it is shared with other
# work (load average 20+); bounded, but generous.
STARTUP_TIMEOUT = 480.0
RELAUNCH_TIMEOUT = 480.0

pytestmark = lane(1200)


@dataclass
class UpFleet:
    popen: subprocess.Popen[bytes]
    state_dir: Path
    out_path: Path
    spawned_at: float
    info: dict[str, Any] = field(default_factory=dict)
    engine_pgids: set[int] = field(default_factory=set)

    def out(self) -> str:
        return self.out_path.read_text(errors="replace")[-3000:]

    def log(self, name: str, tail: int = 3000) -> str:
        try:
            return (self.state_dir / "logs" / f"{name}.log").read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def diagnostics(self) -> str:
        nodes = [n for n in self.info.get("programs", {}) if n.split("-")[0] in ("union", "prefill", "decode")] \
            or ["union-0"]
        names = [*nodes, *(f"{n}.engine-0" for n in nodes), "controller", "coordinator", "gateway"]
        return "\n".join(f"--- {n} ---\n{self.log(n, 2000)}" for n in names) + \
            f"\n--- motor up ---\n{self.out()}"  # fmt: skip

    def brief(self) -> str:
        """A short digest of :meth:`diagnostics`, logged last on a failure: CI shows a failure's first
        and last lines only (about a dozen at the end). One line per entry, each tagged with its
        source; the most telling last: per node its engine's last lines and its nodemanager's last
        warnings (a fault report names its detail), then the coordinator's (a failed request's)."""
        nodes = [n for n in self.info.get("programs", {}) if n.split("-")[0] in ("union", "prefill", "decode")] \
            or ["union-0"]

        def warnings(name: str, n: int) -> list[str]:
            lines = [ln for ln in self.log(name, 200000).splitlines() if " WARNING " in ln or " ERROR " in ln]
            return [f"[{name}] {ln[:300]}" for ln in lines[-n:]]

        out = [*warnings("controller", 2), *warnings("gateway", 1)]
        for n in nodes:
            engine = [ln for ln in self.log(f"{n}.engine-0", 20000).splitlines() if ln.strip()]
            out += [*(f"[{n}.engine-0] {ln[:240]}" for ln in engine[-2:]), *warnings(n, 2)]
        return "\n".join([*out, *warnings("coordinator", 3)])  # a failed request's detail: last

    @property
    def gateway(self) -> str:
        return str(self.info["gateway_url"])

    @property
    def key(self) -> str:
        return Path(self.info["management_key_file"]).read_text().strip()

    @property
    def nodemanager(self) -> str:
        return self.nodemanager_of("union-0")

    def nodemanager_of(self, node: str) -> str:
        return f"127.0.0.1:{self.info['programs'][node]['port']}"


UNION = ("--union", "1", "--prefill", "0", "--decode", "0")


def config_with_engine_env(path: Path, env: dict[str, str]) -> Path:
    """examples/fleet-real-vllm-cpu.yaml with *env* added to every engine's environment."""
    cfg = yaml.safe_load(CONFIG.read_text())
    nm = cfg["nodemanager"]
    for engine in (nm["engine"], *(nm[role]["engine"] for role in ("prefill", "decode") if role in nm)):
        engine["env"] = {**(engine.get("env") or {}), **env}
    path.write_text(yaml.safe_dump(cfg))
    return path


@asynccontextmanager
async def motor_up(state_dir: Path, shape: tuple[str, ...] = UNION, timeout: float = STARTUP_TIMEOUT,
                   config: Path = CONFIG) -> AsyncIterator[UpFleet]:
    state_dir.mkdir(parents=True, exist_ok=True)
    out_path = state_dir / "motor-up.out"
    argv = [tool("motor"), "up", "--config", str(config), *shape,
            "--model", MODEL, "--state-dir", str(state_dir), "--port", "0", "--timeout", str(timeout)]  # fmt: skip
    with open(out_path, "wb") as out:
        t0 = time.monotonic()
        popen = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)  # fmt: skip
    fleet = UpFleet(popen, state_dir, out_path, t0)
    try:

        def ready() -> bool:
            if popen.poll() is not None:
                raise AssertionError(f"motor up exited with {popen.returncode}\n{fleet.diagnostics()}")
            try:
                info = json.loads((state_dir / "fleet.json").read_text())
            except (OSError, ValueError):
                return False
            fleet.info = info
            return bool(info.get("ready"))

        try:
            await wait_for(ready, timeout=timeout + 30, interval=0.2, what="motor up ready")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{fleet.diagnostics()}") from None
        yield fleet
    finally:
        if popen.poll() is None:
            popen.send_signal(signal.SIGINT)  # motor up stops every program (engines too) in order
            try:
                await asyncio.to_thread(popen.wait, 60)
            except subprocess.TimeoutExpired:
                os.killpg(popen.pid, signal.SIGKILL)
                await asyncio.to_thread(popen.wait, 10)
        for pgid in fleet.engine_pgids:  # belt and braces: no engine outlives the test
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)


async def _complete(client: AsyncOpenAI) -> bool:
    r = await client.completions.create(model=MODEL, prompt="Hello, Motor", max_tokens=4)
    return bool(r.choices) and r.choices[0].finish_reason == "length"


async def _first_success(client: AsyncOpenAI, timeout: float, errors: list[str]) -> float:
    """Send completions until one succeeds; returns its time (monotonic)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if await _complete(client):
                return time.monotonic()
        except Exception as exc:
            msg = f"{type(exc).__name__}: {str(exc)[:120]}"
            if not errors or errors[-1] != msg:
                errors.append(msg)
        await asyncio.sleep(0.25)
    raise AssertionError(f"no successful completion within {timeout}s; errors: {errors[-5:]}")


async def _serve_all_shapes(client: AsyncOpenAI) -> None:
    """Completion, chat, streamed completion (with usage) and streamed chat through the gateway."""
    c = await client.completions.create(model=MODEL, prompt="Hello, Motor", max_tokens=6)
    assert c.model == MODEL and c.choices[0].finish_reason == "length"
    assert c.usage is not None and c.usage.completion_tokens == 6
    assert (c.system_fingerprint or "").startswith("vllm-0.32"), c.system_fingerprint  # a real vLLM answered

    ch = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=5)
    assert ch.choices[0].message.role == "assistant" and ch.choices[0].finish_reason == "length"
    assert ch.usage is not None and ch.usage.completion_tokens == 5

    text, finishes, usage = [], [], None
    stream = await client.completions.create(model=MODEL, prompt="Once", max_tokens=8, stream=True,
                                             stream_options={"include_usage": True})  # fmt: skip
    async for chunk in stream:
        for choice in chunk.choices:
            text.append(choice.text)
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
        usage = chunk.usage or usage
    assert finishes == ["length"] and usage is not None and usage.completion_tokens == 8
    assert "".join(text)

    roles: list[str] = []
    chat_finishes: list[str] = []
    n = 0
    cstream = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                   max_tokens=6, stream=True)  # fmt: skip
    async for cchunk in cstream:
        n += 1
        for cchoice in cchunk.choices:
            if cchoice.delta.role:
                roles.append(cchoice.delta.role)
            if cchoice.finish_reason:
                chat_finishes.append(cchoice.finish_reason)
    assert roles[:1] == ["assistant"] and chat_finishes == ["length"] and n >= 3


async def _passthrough_routes(fleet: UpFleet, client: AsyncOpenAI, engine: str) -> dict[str, Any]:
    """The routes relayed whole to one instance (coordinator ``passthrough.py``), through the
    gateway with the openai SDK, each compared with what the engine itself answers."""
    root = AsyncOpenAI(base_url=fleet.gateway, api_key="unused", max_retries=0, timeout=60.0)
    seen: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession() as http:

            async def direct(method: str, path: str, body: Any = None) -> tuple[int, Any]:
                async with http.request(method, engine + path, json=body, timeout=aiohttp.ClientTimeout(total=60)) as r:
                    return r.status, await r.json(content_type=None)

            # /tokenize, /detokenize, /version: the engine's own answers, unchanged
            tok = await root.post("/tokenize", body={"model": MODEL, "prompt": "Hello, Motor"}, cast_to=object)
            assert tok == (await direct("POST", "/tokenize", {"model": MODEL, "prompt": "Hello, Motor"}))[1]
            assert isinstance(tok, dict) and tok["count"] == len(tok["tokens"]) > 1 and tok["max_model_len"] == 256
            text = await root.post("/detokenize", body={"model": MODEL, "tokens": tok["tokens"]}, cast_to=object)
            assert isinstance(text, dict) and "Hello, Motor" in text["prompt"], text
            version = await root.get("/version", cast_to=object)
            assert version == (await direct("GET", "/version"))[1]
            assert isinstance(version, dict) and str(version["version"]).startswith("0.32"), version
            seen["tokenize"], seen["version"] = tok["count"], version["version"]

            # /v1/models: the engine's card (max_model_len, root, parent, permission), owned_by motor
            _, own = await direct("GET", "/v1/models")
            [card] = own["data"]

            async def card_learned() -> Any:
                listed = await client.models.list()
                return listed.data[0] if listed.data and getattr(listed.data[0], "max_model_len", None) else None

            model = await wait_for(card_learned, timeout=60, interval=0.5, what="the engine's model card")
            assert (model.id, model.owned_by) == (MODEL, "motor")
            extra = model.model_extra or {}
            assert (extra["max_model_len"], extra["root"], extra["parent"]) == (
                card["max_model_len"], card["root"], card["parent"])
            strip = ("id", "created")  # vLLM stamps a fresh permission id and time on each answer
            assert [{k: v for k, v in p.items() if k not in strip} for p in extra["permission"]] == \
                [{k: v for k, v in p.items() if k not in strip} for p in card["permission"]]
            seen["max_model_len"] = extra["max_model_len"]

            # /v1/responses: plain, streamed, stored and retrieved, background and cancelled
            made = await client.responses.create(model=MODEL, input="Hello, Motor", max_output_tokens=4, store=True)
            assert made.object == "response" and made.model == MODEL and made.usage is not None
            assert made.usage.output_tokens == 4 and made.status == "incomplete"
            got = await client.responses.retrieve(made.id)
            assert (got.id, got.output_text, got.status) == (made.id, made.output_text, made.status)
            assert (await direct("GET", f"/v1/responses/{made.id}"))[1]["id"] == made.id  # held by this engine
            stream = await client.responses.create(model=MODEL, input="Once", max_output_tokens=3, stream=True)
            kinds = [e.type async for e in stream]
            assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
            assert kinds.count("response.output_text.delta") >= 1
            with pytest.raises(openai.BadRequestError) as sync_cancel:
                await client.responses.cancel(made.id)
            assert "Cannot cancel a synchronous response" in sync_cancel.value.message
            # The tiny CPU model writes 200 tokens in ~0.2 s (less when it stops early), so a cancel
            # sent through gateway and coordinator on a loaded box often arrives after the answer is
            # complete: then vLLM's own 400 for a response no longer running comes back. Either
            # outcome proves the cancel reached the engine holding the response (elsewhere: 404);
            # three tries to see a real cancellation, whose outcome is then checked by a retrieve.
            outcome = ""
            for _ in range(3):
                background = await client.responses.create(model=MODEL, input="A long story", max_output_tokens=200,
                                                           store=True, background=True)
                assert background.status == "queued"
                try:
                    cancelled = await client.responses.cancel(background.id)
                except openai.BadRequestError as exc:
                    assert "Cannot cancel a synchronous response" in exc.message
                    assert (await client.responses.retrieve(background.id)).status in ("completed", "incomplete")
                    outcome = "finished before its cancel"
                    continue
                assert (cancelled.id, cancelled.status) == (background.id, "cancelled")
                assert (await client.responses.retrieve(background.id)).status == "cancelled"
                outcome = "cancelled"
                break
            with pytest.raises(openai.NotFoundError) as unknown:
                await client.responses.retrieve("resp_0000000000000000")
            assert unknown.value.body == {"message": "Response with id 'resp_0000000000000000' not found.",
                                          "type": "invalid_request_error", "param": "response_id", "code": 404}
            seen["responses"] = {"created": made.status, "stream_events": len(kinds), "background": outcome}

            # /v1/embeddings on a generation model: the engine's own 404, in OpenAI's error shape
            status, body = await direct("POST", "/v1/embeddings", {"model": MODEL, "input": "x"})
            assert status == 404, (status, body)
            with pytest.raises(openai.NotFoundError) as emb:
                await client.embeddings.create(model=MODEL, input="x")
            assert isinstance(emb.value.body, dict) and emb.value.body["message"], emb.value.body
            seen["embeddings"] = emb.value.status_code
    finally:
        await root.close()
    return seen


async def _engine_url(fleet: UpFleet) -> str:
    async with open_channel(fleet.info["coordinators"][0]) as ch:
        stub = kgrpc.InstanceRegistryServiceStub(ch)
        resp = await stub.ListInstances(kpb.ListInstancesRequest(page_size=100), metadata=call_metadata(fleet.key),
                                        timeout=5)  # fmt: skip
    [inst] = list(resp.instances)
    [ep] = list(inst.endpoints)
    return f"http://{ep.ip}:{ep.business_port}"


async def _nm_status(fleet: UpFleet, node: str = "union-0") -> npb.GetStatusResponse:
    async with open_channel(fleet.nodemanager_of(node)) as ch:
        stub = ngrpc.NodeManagerServiceStub(ch)
        resp: npb.GetStatusResponse = await stub.GetStatus(npb.GetStatusRequest(), metadata=call_metadata(fleet.key), timeout=5)
        return resp


async def _check_gauges(fleet: UpFleet, engine: str, client: AsyncOpenAI) -> dict[str, float]:
    """The coordinator scrapes the real engine's /metrics (seen in vLLM's access log), and its own
    parser reads the three least-load gauges from it, which move under load."""
    access_log = fleet.state_dir / "logs" / "union-0.engine-0.log"

    def scrapes() -> int:
        return access_log.read_text(errors="replace").count('"GET /metrics HTTP/1.1" 200')

    before = scrapes()  # nobody but the coordinator asks this engine for /metrics yet
    await wait_for(lambda: scrapes() >= before + 3, timeout=15, interval=0.2,
                   what="the coordinator's /metrics scrapes in the engine's access log")  # fmt: skip

    async with aiohttp.ClientSession() as http:

        async def metrics() -> str:
            async with http.get(engine + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
                assert r.status == 200
                return await r.text()

        idle_text = await metrics()
        for g in GAUGES:
            assert f"# TYPE {g} gauge" in idle_text, f"{g} is not a gauge in the real engine's /metrics"
        idle = parse_load(idle_text, EngineType.VLLM)
        assert idle.running == 0 and idle.waiting == 0 and 0 <= idle.kv_usage <= 1

        # 6 long requests on --max-num-seqs 4: running (and maybe waiting, KV usage) must show up
        async def long_one(i: int) -> None:
            await client.completions.create(model=MODEL, prompt=f"load {i}", max_tokens=200,
                                            extra_body={"ignore_eos": True})  # fmt: skip

        load = asyncio.gather(*(long_one(i) for i in range(6)))
        peak = {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0}
        while not load.done():
            seen = parse_load(await metrics(), EngineType.VLLM)
            peak = {"running": max(peak["running"], seen.running), "waiting": max(peak["waiting"], seen.waiting),
                    "kv_usage": max(peak["kv_usage"], seen.kv_usage)}  # fmt: skip
            await asyncio.sleep(0.02)
        await load
    assert 1 <= peak["running"] <= 4, peak
    assert peak["kv_usage"] > 0, peak
    return peak


async def test_fleet_on_real_vllm_serves_and_relaunches_a_killed_engine(tmp_path: Path) -> None:
    assert MODEL_DIR.is_dir(), "no .real-engine/tiny-llama: run scripts/real-engine-setup"
    config = config_with_engine_env(tmp_path / "fleet.yaml", {"VLLM_ENABLE_RESPONSES_API_STORE": "1"})
    async with motor_up(tmp_path / "up", config=config) as fleet:
        client = AsyncOpenAI(base_url=fleet.gateway + "/v1", api_key="unused", max_retries=0, timeout=30.0)
        try:
            start_errors: list[str] = []
            t_ok = await _first_success(client, 60, start_errors)
            startup_s = t_ok - fleet.spawned_at
            status = await _nm_status(fleet)
            [ep] = list(status.endpoints)
            assert ep.status == tpb.ENDPOINT_STATUS_NORMAL and ep.pid > 0
            fleet.engine_pgids.add(ep.pid)  # the engine leads its own process group

            await _serve_all_shapes(client)
            engine = await _engine_url(fleet)
            routes = await _passthrough_routes(fleet, client, engine)
            peak = await _check_gauges(fleet, engine, client)

            # --- kill the real engine; the nodemanager + controller relaunch it in place -------------
            old_pid = ep.pid
            t_kill = time.monotonic()
            os.kill(old_pid, signal.SIGKILL)
            relaunch_errors: list[str] = []
            try:
                t_back = await _first_success(client, RELAUNCH_TIMEOUT, relaunch_errors)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{fleet.diagnostics()}") from None
            relaunch_s = t_back - t_kill

            status = await _nm_status(fleet)
            [ep] = list(status.endpoints)
            assert ep.status == tpb.ENDPOINT_STATUS_NORMAL
            assert ep.pid != old_pid and status.relaunch_count == 1  # (generation: the start command's, unchanged)
            fleet.engine_pgids.add(ep.pid)

            def old_group_gone() -> bool:  # the old EngineCore child died with its group
                try:
                    os.killpg(old_pid, 0)
                except ProcessLookupError:
                    return True
                return False

            await wait_for(old_group_gone, timeout=30, interval=0.2, what="the killed engine's process group to be gone")
            assert "[ENGINE RELAUNCH #1]" in fleet.log("union-0", 10**7)
            await wait_for(lambda: "strategy=engine_relaunch outcome=done" in fleet.log("controller", 10**7),
                           timeout=30, interval=0.2, what="the controller's engine relaunch to finish")  # fmt: skip
            assert await _engine_url(fleet) == engine  # relaunched in place: same endpoint
            await _serve_all_shapes(client)
        finally:
            await client.close()

    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "loadavg": os.getloadavg(),
        "command": f"motor up --config {CONFIG.relative_to(ROOT)} --union 1 --prefill 0 --decode 0",
        "startup_s": round(startup_s, 1),
        "relaunch_s": round(relaunch_s, 1),
        "errors_during_relaunch": relaunch_errors,
        "peak_load_seen": peak,
        "passthrough_routes": routes,
    }
    with contextlib.suppress(OSError):
        (ROOT / ".real-engine" / "last-fleet-run.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nreal vLLM fleet: start-up (spawn -> first 200 through the gateway) {startup_s:.1f} s; "
          f"relaunch (SIGKILL engine -> first 200) {relaunch_s:.1f} s; peak gauges {peak}; "
          f"errors while relaunching {relaunch_errors}; pass-through routes {routes}")  # fmt: skip
