"""The clients in clients/ (TypeScript with proto-loader and with Connect-ES, Go, Java, C++),
generated from protos/, against a real `motor up` fleet: Health/Check, ListInstances on the
controller and the coordinator with the management key, GetInstance on an id taken from the list
(ids are exact in every language), a streamed Dispatch, and an error's google.rpc.ErrorInfo.reason
decoded from grpc-status-details-bin.

Every client is built here from the current sources while the fleet starts (tests/clients/builds.py:
Go every time, the others when a source is newer than the built client), so a test never runs a
client older than its sources. Without their toolchain (npm packages from `npm ci`, Debian packages:
scripts/setup --tools) the Connect-ES, Java and C++ clients skip on a developer machine and fail
under CI=true; the proto-loader TypeScript and Go clients (the two the issue asks for) always fail."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.clients.builds import CLIENT, CLIENTS, build
from tests.helpers import wait_for
from tests.motor_up import UpFleet, motor_up

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]
MAX_SAFE = 2**53 - 1
# What Connect's default protocol (createConnectTransport, HTTP/2) gets from Motor's gRPC servers
# (the stream is closed with HTTP/2 INTERNAL_ERROR): quoted in docs/clients.md.
CONNECT_PROTOCOL_ERROR = {"check": "connect_protocol", "ok": False, "code": "INTERNAL",
                          "message": "[internal] Stream closed with error code NGHTTP2_INTERNAL_ERROR"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def builds() -> AsyncIterator[dict[str, asyncio.Task[str]]]:
    """Every client's build, started at once so that they overlap the fleet's start, one after the
    other (one compiler at a time on a two-core box; the quick ones first). Each test awaits its own."""
    tasks: dict[str, asyncio.Task[str]] = {}

    async def after(previous: asyncio.Task[str] | None, lang: str) -> str:
        if previous is not None:
            await asyncio.wait([previous])
        return await build(lang)

    previous = None
    for lang in CLIENT:
        previous = tasks[lang] = asyncio.create_task(after(previous, lang))
    yield tasks
    for task in tasks.values():
        task.cancel()


async def built_client(builds: dict[str, asyncio.Task[str]], lang: str) -> Path:
    """The client of *lang*, built from the current sources; an optional one skips without its
    toolchain outside CI (CI=true fails)."""
    problem = await asyncio.shield(builds[lang])
    if problem:
        if problem.startswith("no ") and CLIENT[lang].optional \
                and os.environ.get("CI", "").lower() not in ("true", "1"):
            pytest.skip(problem)
        pytest.fail(problem)
    return CLIENT[lang].built


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory,
                builds: dict[str, asyncio.Task[str]]) -> AsyncIterator[UpFleet]:
    tmp = tmp_path_factory.mktemp("clients")
    config = tmp / "fleet.yaml"  # the engines keep store=true responses, as vLLM does with this variable
    config.write_text('nodemanager: {engine: {env: {VLLM_ENABLE_RESPONSES_API_STORE: "1"}}}\n')
    async with motor_up(tmp, "--prefill", "1", "--decode", "1", "--zero-latency", "--config", str(config)) as up:
        yield up


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tls_fleet(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[UpFleet]:
    """`motor up --tls`: mutual TLS on every gRPC port; fleet.json's `tls` names the CA and the
    client certificate the clients present."""
    async with motor_up(tmp_path_factory.mktemp("clients-tls"), "--prefill", "1", "--decode", "1",
                        "--zero-latency", "--tls") as up:
        yield up


async def run_client(argv: list[str], cwd: Path) -> list[dict[str, Any]]:
    out = await asyncio.to_thread(subprocess.run, argv, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{argv} failed:\n{out.stdout}\n{out.stderr}"
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def assert_checks(checks: list[dict[str, Any]]) -> None:
    by = {c["check"]: c for c in checks}
    assert by["health"]["status"] == "SERVING"
    ids = by["controller.ListInstances"]["ids"]
    assert len(ids) == 2 and all(0 < int(i) <= MAX_SAFE for i in ids)
    got = by["coordinator.GetInstance"]
    assert got["id"] in ids and got["listed"] == 2 and got["role"] in ("ROLE_PREFILL", "ROLE_DECODE")
    assert by["coordinator.Dispatch"]["http_status"] == 200 and by["coordinator.Dispatch"]["done"] is True
    assert by["coordinator.Dispatch"]["frames"] >= 2  # head, then body chunks
    assert by["error"] == {"check": "error", "code": "NOT_FOUND", "reason": "INSTANCE_NOT_FOUND"}


@pytest.mark.timeout(900)  # waits for the builds before it (once per session, only when a source changed)
async def test_typescript_client(fleet: UpFleet, builds: dict[str, asyncio.Task[str]]) -> None:
    argv, cwd = await client_argv("ts", builds)
    assert_checks(await run_client([*argv, str(fleet.state / "fleet.json")], cwd))


@pytest.mark.timeout(900)
async def test_go_client(fleet: UpFleet, builds: dict[str, asyncio.Task[str]]) -> None:
    argv, cwd = await client_argv("go", builds)
    assert_checks(await run_client([*argv, str(fleet.state / "fleet.json")], cwd))


@pytest.mark.timeout(900)  # waits for the build (once per session, only when a source changed)
async def test_typescript_connect_client(fleet: UpFleet, builds: dict[str, asyncio.Task[str]]) -> None:
    """Connect-ES v2 (protoc-gen-es messages and service descriptors, createGrpcTransport): the same
    checks with ids as bigint; and Connect's own protocol (createConnectTransport), which Motor's
    gRPC servers do not speak, fails as docs/clients.md says."""
    argv, cwd = await client_argv("ts-connect", builds)
    checks = await run_client([*argv, str(fleet.state / "fleet.json")], cwd)
    assert_checks(checks)
    assert_connect_protocol_refused(checks)


def assert_connect_protocol_refused(checks: list[dict[str, Any]]) -> None:
    connect = next(c for c in checks if c["check"] == "connect_protocol")
    assert connect == CONNECT_PROTOCOL_ERROR, connect


@pytest.mark.timeout(900)
async def test_java_client(fleet: UpFleet, builds: dict[str, asyncio.Task[str]]) -> None:
    client = await built_client(builds, "java")
    assert_checks(await run_client([str(client), str(fleet.state / "fleet.json")], client.parent))


@pytest.mark.timeout(900)
async def test_cpp_client(fleet: UpFleet, builds: dict[str, asyncio.Task[str]]) -> None:
    client = await built_client(builds, "cpp")
    assert_checks(await run_client([str(client), str(fleet.state / "fleet.json")], client.parent))


@pytest.mark.timeout(900)
async def test_npm_openai_sdk_through_the_gateway(fleet: UpFleet, builds: dict[str, asyncio.Task[str]]) -> None:
    argv, ts = await client_argv("ts", builds)  # dist/openai_check.js is compiled with dist/client.js

    async def card_known() -> bool:  # the coordinator reads the engines' card within a scrape interval
        async with aiohttp.ClientSession() as s, s.get(fleet.info["gateway_url"] + "/v1/models") as r:
            return all("max_model_len" in m for m in (await r.json())["data"])

    await wait_for(card_known, timeout=30, what="the engines' model card learned by the coordinator")
    checks = await run_client([argv[0], "dist/openai_check.js", fleet.info["gateway_url"] + "/v1", "tiny"], ts)
    by = {c["check"]: c for c in checks}
    assert by["models.list"]["ids"] == ["tiny"]
    assert by["models.retrieve"] == {"check": "models.retrieve", "id": "tiny", "object": "model"}
    assert by["completions"] == {"check": "completions", "text": True, "completion_tokens": 8}
    assert by["chat.stream"]["text"] is True and by["chat.stream"]["chunks"] >= 2
    # Both errors parse as OpenAI errors in the SDK: {"error": {"message", "type", "param", "code"}}.
    # pass-through routes (coordinator passthrough.py) and the engines' own model card
    assert by["responses"] == {"check": "responses", "text": True, "output_tokens": 4, "status": "incomplete"}
    stream = by["responses.stream"]
    assert (stream["first"], stream["last"], stream["deltas"], stream["text"]) == (
        "response.created", "response.completed", 3, True)
    assert by["error.embeddings"]["status"] == 404  # the engine's own 404, in OpenAI's error shape
    # stored responses: retrieved from the engine that made them (coordinator response_homes.py)
    assert by["responses.retrieve"] == {"check": "responses.retrieve", "same_id": True, "same_output": True,
                                        "status": "incomplete"}
    unknown_response = by["error.responses.unknown"]
    assert (unknown_response["status"], unknown_response["param"], unknown_response["code"]) == (404, "response_id", 404)
    assert "Response with id 'resp_0000000000000000' not found." in unknown_response["message"]
    assert by["error.responses.delete"]["status"] == 405  # vLLM serves no DELETE
    assert by["tokenize"] == {"check": "tokenize", "count": 4, "prompt": "the sun is hot"}
    assert by["version"] == {"check": "version", "status": 200, "body": {"version": "0.32.0"}}  # the engines' own
    card = by["models.card"]
    assert card["max_model_len"] and card["root"] and card["permission"] == 1, card
    unknown = by["error.unknown_model"]
    assert (unknown["status"], unknown["type"], unknown["code"]) == (404, "not_found_error", "model_not_found")
    engine = by["error.engine"]
    assert engine["status"] == 400 and engine["param"] == "max_tokens" and "max_tokens" in engine["message"]


async def client_argv(lang: str, builds: dict[str, asyncio.Task[str]]) -> tuple[list[str], Path]:
    """How to run the client of *lang*, built from the current sources (its argv without the fleet
    file, and its directory)."""
    built = await built_client(builds, lang)
    if built.suffix == ".js":
        node = shutil.which("node")
        assert node, "node is not installed"
        return [node, str(built.relative_to(CLIENTS / lang))], CLIENTS / lang
    return [str(built)], built.parent


@pytest.mark.timeout(900)
@pytest.mark.parametrize("lang", ["ts", "ts-connect", "go", "java", "cpp"])
async def test_client_over_mutual_tls(lang: str, tls_fleet: UpFleet, builds: dict[str, asyncio.Task[str]]) -> None:
    """The same checks against `motor up --tls`: each client verifies the servers with the fleet CA
    and presents the client certificate (the snippets docs/clients.md shows for TLS)."""
    tls = tls_fleet.info["tls"]
    assert tls and all(Path(tls[k]).exists() for k in ("ca_file", "cert_file", "key_file"))
    argv, cwd = await client_argv(lang, builds)
    checks = await run_client([*argv, str(tls_fleet.state / "fleet.json")], cwd)
    assert_checks(checks)
    if lang == "ts-connect":
        assert_connect_protocol_refused(checks)
