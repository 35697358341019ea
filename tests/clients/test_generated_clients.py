"""The clients in clients/ (TypeScript, Go), generated from protos/, against a real `motor up` fleet:
Health/Check, ListInstances on the controller and the coordinator with the management key,
GetInstance on an id taken from the list (ids are exact in every language), a streamed Dispatch,
and an error's google.rpc.ErrorInfo.reason decoded from grpc-status-details-bin."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.helpers import wait_for
from tests.motor_up import UpFleet, motor_up

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]
ROOT = Path(__file__).resolve().parents[2]
MAX_SAFE = 2**53 - 1


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[UpFleet]:
    async with motor_up(tmp_path_factory.mktemp("clients"), "--prefill", "1", "--decode", "1",
                        "--zero-latency") as up:
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


async def test_typescript_client(fleet: UpFleet) -> None:
    ts = ROOT / "clients" / "ts"
    if not (ts / "dist" / "client.js").exists():
        pytest.fail("clients/ts is not built: run scripts/setup --tools (npm ci && npx tsc in clients/ts)")
    node = shutil.which("node")
    assert node, "node is not installed"
    assert_checks(await run_client([node, "dist/client.js", str(fleet.state / "fleet.json")], ts))


async def test_go_client(fleet: UpFleet) -> None:
    binary = ROOT / "clients" / "go" / "motor-client"
    if not binary.exists():
        pytest.fail("clients/go is not built: run scripts/setup --tools (clients/go/generate.sh)")
    assert_checks(await run_client([str(binary), str(fleet.state / "fleet.json")], binary.parent))


async def test_npm_openai_sdk_through_the_gateway(fleet: UpFleet) -> None:
    ts = ROOT / "clients" / "ts"
    if not (ts / "dist" / "openai_check.js").exists():
        pytest.fail("clients/ts is not built: run scripts/setup --tools (npm ci && npx tsc in clients/ts)")
    node = shutil.which("node")
    assert node, "node is not installed"

    async def card_known() -> bool:  # the coordinator reads the engines' card within a scrape interval
        async with aiohttp.ClientSession() as s, s.get(fleet.info["gateway_url"] + "/v1/models") as r:
            return all("max_model_len" in m for m in (await r.json())["data"])

    await wait_for(card_known, timeout=30, what="the engines' model card learned by the coordinator")
    checks = await run_client([node, "dist/openai_check.js", fleet.info["gateway_url"] + "/v1", "tiny"], ts)
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
    assert by["tokenize"] == {"check": "tokenize", "count": 4, "prompt": "the sun is hot"}
    card = by["models.card"]
    assert card["max_model_len"] and card["root"] and card["permission"] == 1, card
    unknown = by["error.unknown_model"]
    assert (unknown["status"], unknown["type"], unknown["code"]) == (404, "not_found_error", "model_not_found")
    engine = by["error.engine"]
    assert engine["status"] == 400 and engine["param"] == "max_tokens" and "max_tokens" in engine["message"]
