"""``motor register`` against a real ``motor-coordinator`` process (management key on)."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
from aiohttp import web

from motor_cli import register as register_mod
from motor_cli.main import main as motor
from motor_cli.registration import build_instance, parse_endpoint
from motor_common.convert import instance_to_pb
from motor_common.domain import STANDALONE_ID_BIT, EngineType, Instance, Role
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from tests.conftest import tool
from tests.helpers import free_port
from tests.procs import start_coordinator

KEY = "cli-test-key"
_ports = itertools.count(20000)


def ports(n: int = 1) -> list[int]:
    return [next(_ports) for _ in range(n)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def coordinator(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, str]]:
    logs = tmp_path_factory.mktemp("cli-coordinator")
    key_file = logs / "cli.key"
    key_file.write_text(KEY + "\n")
    async with start_coordinator(logs, management_key=KEY) as proc:
        yield {"addr": proc.address, "key": str(key_file), "logs": str(logs)}


def run(coordinator: dict[str, str], *args: str, key: str | None = None) -> int:
    return motor(["register", *args[:1], "--coordinator", coordinator["addr"],
                  "--management-key-file", key or coordinator["key"], *args[1:]])


def listed(coordinator: dict[str, str], capsys: pytest.CaptureFixture[str]) -> dict[int, dict[str, Any]]:
    capsys.readouterr()
    assert run(coordinator, "list", "--json") == 0
    doc = orjson.loads(capsys.readouterr().out)
    return {i["id"]: i for i in doc["instances"]}


def add(coordinator: dict[str, str], role: str, *endpoints: str, extra: tuple[str, ...] = ()) -> int:
    args = ["add", "--role", role, "--model", "tiny", "--engine", "vllm", "--no-health-check", *extra]
    for ep in endpoints:
        args += ["--endpoint", ep]
    return run(coordinator, *args)


def test_add_registers_the_derived_identity_and_readd_is_idempotent(
    coordinator: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = ports(2)
    eps = [f"127.0.0.1:{b},kv=7001", f"127.0.0.1:{a},kv=7000"]
    expected = build_instance(Role.PREFILL, "tiny", EngineType.VLLM, [parse_endpoint(e) for e in eps])
    assert add(coordinator, "prefill", *eps) == 0
    got = listed(coordinator, capsys)[expected.id]
    assert got["job"] == expected.job_name
    assert got["role"] == "prefill"
    assert [(e["id"], e["port"], e["kv_port"]) for e in got["endpoints"]] == [(0, a, 7000), (1, b, 7001)]
    # the same endpoints in another order are the same instance: nothing new is added
    capsys.readouterr()
    assert add(coordinator, "prefill", *reversed(eps), extra=("--json",)) == 0
    doc = orjson.loads(capsys.readouterr().out)
    assert doc["added"] == []
    assert [i["id"] for i in doc["already_registered"]] == [expected.id]


def test_endpoint_registered_under_another_role_is_refused(
    coordinator: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (a,) = ports()
    assert add(coordinator, "prefill", f"127.0.0.1:{a}") == 0
    before = listed(coordinator, capsys)
    assert add(coordinator, "decode", f"127.0.0.1:{a}") == 1
    err = capsys.readouterr().err
    assert f"127.0.0.1:{a} is already registered in instance" in err
    assert len(err.strip().splitlines()) == 1
    assert listed(coordinator, capsys) == before


def test_delete_by_endpoint_or_id_uses_the_registered_identity(
    coordinator: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b, c = ports(3)
    assert add(coordinator, "decode", f"127.0.0.1:{a}", f"127.0.0.1:{b}", extra=("--job", "my-custom-job")) == 0
    assert add(coordinator, "union", f"127.0.0.1:{c}") == 0
    ids = {i["endpoints"][0]["port"]: iid for iid, i in listed(coordinator, capsys).items()}
    # by one endpoint of a two-endpoint instance with a custom job name
    assert run(coordinator, "del", "--endpoint", f"127.0.0.1:{b}") == 0
    assert ids[a] not in listed(coordinator, capsys)
    # by id
    assert run(coordinator, "del", "--id", str(ids[c])) == 0
    assert ids[c] not in listed(coordinator, capsys)


def test_delete_of_unknown_id_is_refused(coordinator: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    before = listed(coordinator, capsys)
    assert run(coordinator, "del", "--id", "12345") == 1
    assert "instance 12345 is not registered" in capsys.readouterr().err
    assert run(coordinator, "del", "--endpoint", "127.0.0.1:1999") == 1
    assert "no registered instance serves endpoint 127.0.0.1:1999" in capsys.readouterr().err
    assert listed(coordinator, capsys) == before


def test_set_from_file_replaces_the_whole_set(
    coordinator: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a, b = ports(2)
    spec = tmp_path / "instances.yaml"
    spec.write_text(
        "instances:\n"
        f"  - {{role: prefill, model: tiny, engine: sglang, endpoints: ['127.0.0.1:{a},bootstrap=8998']}}\n"
        f"  - {{role: decode, model: tiny, engine: sglang, endpoints: ['127.0.0.1:{b}'], job: d1}}\n"
    )
    assert run(coordinator, "set", "--file", str(spec), "--no-health-check") == 0
    now = listed(coordinator, capsys)
    assert sorted((i["role"], i["endpoints"][0]["port"]) for i in now.values()) == [("decode", b), ("prefill", a)]
    assert {i["engine"] for i in now.values()} == {"sglang"}


def test_registration_file_with_unknown_key_is_rejected(
    coordinator: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("instances:\n  - {role: prefill, model: m, engine: vllm, endpoints: ['127.0.0.1:2000'], mgmt_port: 1}\n")
    assert run(coordinator, "set", "--file", str(spec), "--no-health-check") == 1
    assert "mgmt_port" in capsys.readouterr().err


def test_wrong_management_key_is_one_clear_line(
    coordinator: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong.key"
    wrong.write_text("nope")
    assert run(coordinator, "list", key=str(wrong)) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: UNAUTHENTICATED: ")
    assert len(err.splitlines()) == 1


def test_unreachable_coordinator_is_one_clear_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    addr = f"127.0.0.1:{free_port()}"
    assert motor(["register", "list", "--coordinator", addr, "--timeout", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: UNAVAILABLE: ") or err.startswith("error: DEADLINE_EXCEEDED: ")
    assert len(err.splitlines()) == 1


def test_list_table_is_human_readable(coordinator: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert run(coordinator, "list") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["ID", "ROLE", "MODEL", "ENGINE", "STATUS", "JOB", "ENDPOINTS"]
    assert out[-1].startswith("available ")


async def test_engine_with_empty_model_list_is_not_registered(tmp_path: Path) -> None:
    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        # the coordinator address is never reached: the probe fails first
        proc = await asyncio.create_subprocess_exec(
            tool("motor"), "register", "add", "--role", "union", "--model", "tiny", "--engine", "vllm",
            "--endpoint", f"127.0.0.1:{port}", "--coordinator", f"127.0.0.1:{free_port()}",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={k: v for k, v in os.environ.items() if not k.startswith("MOTOR_")},
        )
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        await runner.cleanup()
    assert proc.returncode == 1
    assert b"empty model list" in err
    assert b"--no-health-check" in err


def test_kv_events_ports_given_to_add_reach_the_coordinator_and_come_back_in_list(
    coordinator: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (a,) = ports(1)
    ep = f"127.0.0.1:{a},kv=7100,kv_events=7200,kv_events_replay=7300"
    expected = build_instance(Role.PREFILL, "tiny", EngineType.VLLM, [parse_endpoint(ep)])
    assert add(coordinator, "prefill", ep) == 0
    got = listed(coordinator, capsys)[expected.id]["endpoints"][0]
    assert (got["kv_events_port"], got["kv_events_replay_port"]) == (7200, 7300)


def _race_after_listings(monkeypatch: pytest.MonkeyPatch, *others: Instance) -> list[int]:
    """Another writer registers ``others[k]`` between the CLI's listing k and its write; returns
    the generations the CLI listed."""
    real_list = register_mod.Registry.list
    seen: list[int] = []

    async def racing_list(self: register_mod.Registry) -> tuple[list[Instance], Any]:
        out = await real_list(self)
        seen.append(out[1].generation)
        if len(seen) <= len(others):
            await self.stub.AddInstances(cpb.AddInstancesRequest(instances=[instance_to_pb(others[len(seen) - 1])]),
                                         timeout=5, metadata=self.metadata)
        return out

    monkeypatch.setattr(register_mod.Registry, "list", racing_list)
    return seen


def test_set_is_planned_again_when_another_writer_changes_the_set_after_the_listing(
    coordinator: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a, b = ports(2)
    spec = tmp_path / "instances.yaml"
    spec.write_text(f"instances:\n  - {{role: union, model: tiny, engine: vllm, endpoints: ['127.0.0.1:{a}']}}\n")
    assert run(coordinator, "set", "--file", str(spec), "--no-health-check") == 0
    # a controller-managed instance (no standalone bit) appears after the CLI listed the set:
    # `set` must not drop it silently (it refuses to drop managed instances without --force)
    managed = build_instance(Role.DECODE, "tiny", EngineType.VLLM, [parse_endpoint(f"127.0.0.1:{b}")])
    managed = replace(managed, id=managed.id & ~STANDALONE_ID_BIT)
    seen = _race_after_listings(monkeypatch, managed)
    capsys.readouterr()
    assert run(coordinator, "set", "--file", str(spec), "--no-health-check") == 1
    err = capsys.readouterr().err
    assert "changed while this command ran" in err and "controller-managed" in err and "--force" in err
    assert len(seen) == 2 and seen[1] == seen[0] + 1  # listed again after the other writer's add
    monkeypatch.undo()
    assert managed.id in listed(coordinator, capsys)  # still registered
    # with --force it goes, and the report names the instance dropped by this set
    capsys.readouterr()
    assert run(coordinator, "set", "--file", str(spec), "--no-health-check", "--force", "--json") == 0
    doc = orjson.loads(capsys.readouterr().out)
    assert [i["id"] for i in doc["dropped"]] == [managed.id]
    assert managed.id not in listed(coordinator, capsys)


def test_a_write_that_keeps_losing_the_race_gives_up_with_one_clear_line(
    coordinator: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, *others = ports(4)
    before = listed(coordinator, capsys)
    seen = _race_after_listings(monkeypatch, *(
        build_instance(Role.DECODE, "tiny", EngineType.VLLM, [parse_endpoint(f"127.0.0.1:{p}")]) for p in others))
    assert add(coordinator, "prefill", f"127.0.0.1:{a}") == 1
    err = capsys.readouterr().err
    assert "ABORTED" in err and "list the instances again" in err
    assert len(seen) == 3  # three tries, then the error
    monkeypatch.undo()
    mine = build_instance(Role.PREFILL, "tiny", EngineType.VLLM, [parse_endpoint(f"127.0.0.1:{a}")])
    after = listed(coordinator, capsys)
    assert mine.id not in after and len(after) == len(before) + 3  # only the other writer's adds
