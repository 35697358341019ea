"""Observability of a real `motor up` fleet: the gateway's access log, read back from its log file.

Real processes throughout (coordinator, controller, nodemanagers launching `motor-sim` engines,
gateway); requests through the `openai` SDK.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import tool
from tests.helpers import wait_for
from tests.motor_up import UpFleet, motor_up

pytestmark = pytest.mark.slow


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[UpFleet]:
    async with motor_up(tmp_path, "--prefill", "1", "--decode", "1") as up:
        yield up


def _access_lines(up: UpFleet) -> list[dict[str, Any]]:
    """The gateway's access-log lines; `motor up` writes logs in the text format
    (``<ts> INFO    gateway motor.access: request k=v ...``)."""
    out = []
    for line in (up.state / "logs" / "gateway.log").read_text(errors="replace").splitlines():
        if " motor.access: request " not in line:
            continue
        fields: dict[str, Any] = {"msg": "request", "service": line.split()[3]}
        for key, value in re.findall(r" (\w+)=(\S+)", line):
            fields[key] = json.loads(value) if re.fullmatch(r"-?[0-9.]+", value) else (
                {"True": True, "False": False}.get(value, value))
        out.append(fields)
    return out


def _line_for(up: UpFleet, rid: str) -> dict[str, Any] | None:
    found = [r for r in _access_lines(up) if r.get("request_id") == rid]
    assert len(found) <= 1, found
    return found[0] if found else None


async def test_access_log_has_one_structured_line_per_request(fleet: UpFleet) -> None:
    client = openai.AsyncOpenAI(base_url=fleet.info["gateway_url"] + "/v1", api_key="unused",
                                max_retries=0, timeout=10)
    resp = await client.completions.create(model="tiny", prompt="Hello, Motor", max_tokens=7,
                                           extra_headers={"X-Request-Id": "obs-plain-1"})
    assert resp.usage is not None
    stream = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=5, stream=True,
        stream_options={"include_usage": True}, extra_headers={"X-Request-Id": "obs-stream-1"})
    usage = [c.usage async for c in stream if c.usage is not None]
    assert len(usage) == 1
    with pytest.raises(openai.NotFoundError):
        await client.completions.create(model="no-such-model", prompt="x", max_tokens=2,
                                        extra_headers={"X-Request-Id": "obs-missing-1"})

    await wait_for(lambda: _line_for(fleet, "obs-missing-1") is not None, timeout=10)
    plain = _line_for(fleet, "obs-plain-1")
    assert plain is not None
    assert plain["msg"] == "request" and plain["service"] == "gateway" and plain["method"] == "POST"
    assert plain["route"] == "/v1/completions" and plain["status"] == 200
    assert plain["model"] == "tiny" and plain["stream"] is False
    assert plain["prompt_tokens"] == resp.usage.prompt_tokens
    assert plain["completion_tokens"] == resp.usage.completion_tokens == 7
    assert 0 < plain["latency_ms"] < 10_000

    streamed = _line_for(fleet, "obs-stream-1")
    assert streamed is not None
    assert streamed["route"] == "/v1/chat/completions" and streamed["status"] == 200
    assert streamed["stream"] is True and streamed["model"] == "tiny"
    assert streamed["prompt_tokens"] == usage[0].prompt_tokens
    assert streamed["completion_tokens"] == usage[0].completion_tokens == 5

    missing = _line_for(fleet, "obs-missing-1")
    assert missing is not None
    assert missing["status"] == 404 and missing["model"] == "no-such-model"
    assert "prompt_tokens" not in missing and "completion_tokens" not in missing


def _status_json(up: UpFleet) -> dict[str, Any]:
    out = subprocess.run([tool("motor"), "status", "--state-dir", str(up.state), "--json"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


async def test_every_program_serves_metrics_health_ready_listed_by_motor_status(fleet: UpFleet) -> None:
    programs = _status_json(fleet)["programs"]
    assert sorted(programs) == ["controller", "coordinator", "decode-0", "gateway", "prefill-0"]
    assert {p["kind"] for p in programs.values()} == {"controller", "coordinator", "nodemanager", "gateway"}

    async def all_ready(http: aiohttp.ClientSession) -> bool:
        for p in programs.values():
            async with http.get(p["ready"], timeout=aiohttp.ClientTimeout(total=5)) as resp:
                if resp.status != 200:
                    return False
        return True

    async with aiohttp.ClientSession() as http:
        await wait_for(lambda: all_ready(http), timeout=30, what="every program's /ready answers 200")
        texts: dict[str, str] = {}
        for name, p in programs.items():
            for ep in ("metrics", "health", "ready"):
                assert p[ep].endswith("/" + ep), p
            async with http.get(p["health"], timeout=aiohttp.ClientTimeout(total=5)) as resp:
                assert resp.status == 200, name
            async with http.get(p["metrics"], timeout=aiohttp.ClientTimeout(total=5)) as resp:
                assert resp.status == 200, name
                assert resp.headers["Content-Type"].startswith("text/plain")
                texts[name] = await resp.text()
            assert "# TYPE process_cpu_seconds_total counter" in texts[name], name
    # the coordinator has no co-located front here: no (empty) gateway families
    assert "motor_gateway_" not in texts["coordinator"]
    assert "# TYPE motor_gateway_requests_total counter" in texts["gateway"]

    human = subprocess.run([tool("motor"), "status", "--state-dir", str(fleet.state)],
                           capture_output=True, text=True, timeout=30)
    assert human.returncode == 0, human.stderr
    assert "PROGRAM" in human.stdout and programs["coordinator"]["metrics"] in human.stdout


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


async def test_domain_metrics_move_with_traffic(fleet: UpFleet) -> None:
    programs = _status_json(fleet)["programs"]
    client = openai.AsyncOpenAI(base_url=fleet.info["gateway_url"] + "/v1", api_key="unused",
                                max_retries=0, timeout=10)
    for _ in range(3):
        await client.completions.create(model="tiny", prompt="Hello, Motor", max_tokens=4)
    stream = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=6, stream=True)
    assert [c async for c in stream]
    with pytest.raises(openai.NotFoundError):
        await client.completions.create(model="no-such-model", prompt="x", max_tokens=2)

    async with aiohttp.ClientSession() as http, http.get(programs["coordinator"]["metrics"]) as resp:
        s = _samples(await resp.text())
    ok = dict(model="tiny", mode="pd")
    assert _value(s, "motor_coordinator_requests_total", outcome="success", **ok) == 4
    # the unknown model is not a label value: it is counted under model="none"
    assert _value(s, "motor_coordinator_requests_total", model="none", outcome="failed") == 1
    assert not [k for k in s if ("model", "no-such-model") in k[1]]
    assert _value(s, "motor_coordinator_e2e_request_latency_seconds_count", **ok) == 4
    assert _value(s, "motor_coordinator_time_to_first_token_seconds_count", **ok) == 1
    # gaps between relayed chunks (the simulated engine spaces its tokens as a GPU would)
    assert _value(s, "motor_coordinator_inter_token_latency_seconds_count", **ok) >= 1
    assert _value(s, "motor_coordinator_requests_in_flight") == 0
    # PD phases of the 4 served requests, each timed once on its instance's role
    for role, phase in (("prefill", "prefill"), ("decode", "decode_first_byte"), ("decode", "kv_handoff")):
        assert _value(s, "motor_coordinator_pd_phase_duration_seconds_count", model="tiny", role=role, phase=phase) == 4
        assert _value(s, "motor_coordinator_pd_phase_duration_seconds_sum", model="tiny", role=role, phase=phase) > 0
    # one scheduling decision per role and request (the unknown model never reached the policy)
    for role in ("prefill", "decode"):
        assert _value(s, "motor_coordinator_policy_decisions_total", policy="least_load", role=role, outcome="routed") == 4
    assert not [k for k in s if k[0] in ("motor_coordinator_retries_total", "motor_coordinator_failovers_total")]

    async with aiohttp.ClientSession() as http, http.get(programs["controller"]["metrics"]) as resp:
        c = _samples(await resp.text())
    assert _value(c, "motor_controller_acting") == 1
    assert _value(c, "motor_controller_instances", state="active") == 2
    assert _value(c, "motor_controller_instances", state="recovering") == 0
    assert _value(c, "motor_controller_nodes", alive="true") == 2
    assert _value(c, "motor_controller_nodes", alive="false") == 0
    for node in ("prefill-0", "decode-0"):
        assert 0 <= _value(c, "motor_controller_node_heartbeat_age_seconds", node=node) < 30
        assert _value(c, "motor_controller_node_engine_relaunches", node=node) == 0
    assert _value(c, "motor_controller_alarms_active", kind="precision") == 0
    assert ("motor_controller_alarms_active", frozenset({("kind", "store_unavailable")})) in c
    # recoveries by strategy and outcome: exported from the start, none ran
    assert _value(c, "motor_controller_recovery_results_total", strategy="engine_relaunch", outcome="done") == 0
    assert _value(c, "motor_controller_recovery_results_total", strategy="node_restart", outcome="failed") == 0


ROOT = Path(__file__).resolve().parents[2]
# Series Prometheus itself adds to every target, and the labels it attaches (not in any registry).
SYNTHETIC = {"up"}
TARGET_LABELS = {"job", "instance"}
_METRIC = re.compile(r"\b(motor_[a-z0-9_]+|process_[a-z0-9_]+|python_[a-z0-9_]+|up)\b(?!\s*\()")
_MATCHER = re.compile(r"\{([^}]*)\}")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def _declared_labels() -> dict[str, set[str]]:
    """Label names of every metric object the programs' metric modules define (families without
    a sample yet show no labels in a scrape)."""
    import importlib

    from prometheus_client.metrics import MetricWrapperBase

    out: dict[str, set[str]] = {}
    for mod in ("motor_common.openai_front.metrics", "motor_coordinator.metrics", "motor_coordinator.request_metrics",
                "motor_coordinator.precision_monitor", "motor_coordinator.dispatch_trace",
                "motor_controller.recovery_metrics"):
        for obj in vars(importlib.import_module(mod)).values():
            if isinstance(obj, MetricWrapperBase):
                out[obj._name] = set(obj._labelnames)
    return out


def _series_names(family: Any) -> set[str]:
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
                "summary": ("_count", "_sum", "_created")}.get(family.type, ("",))
    return {family.name + s for s in suffixes} | {s.name for s in family.samples}


def _expressions() -> list[tuple[str, str]]:
    rules = yaml.safe_load((ROOT / "deploy/prometheus/motor-alerts.yaml").read_text())
    out = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert {"alert", "expr", "labels", "annotations"} <= set(rule), rule
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}
            out.append((f"alert {rule['alert']}", rule["expr"]))
    dash = json.loads((ROOT / "deploy/grafana/motor-dashboard.json").read_text())
    assert dash["panels"]
    for panel in dash["panels"]:
        assert panel["targets"], panel["title"]
        out.extend((f"panel {panel['title']!r}", t["expr"]) for t in panel["targets"])
    return out


async def test_dashboard_and_alert_rules_name_only_existing_metrics(fleet: UpFleet) -> None:
    programs = _status_json(fleet)["programs"]
    client = openai.AsyncOpenAI(base_url=fleet.info["gateway_url"] + "/v1", api_key="unused",
                                max_retries=0, timeout=10)
    await client.completions.create(model="tiny", prompt="Hello", max_tokens=2)
    labels: dict[str, set[str]] = {}  # series name -> label names seen or declared
    declared = _declared_labels()
    async with aiohttp.ClientSession() as http:
        for p in programs.values():
            async with http.get(p["metrics"]) as resp:
                assert resp.status == 200
                text = await resp.text()
            for fam in text_string_to_metric_families(text):
                for name in _series_names(fam):
                    got = labels.setdefault(name, set())
                    got |= declared.get(fam.name, set())
                    if name.endswith("_bucket"):
                        got.add("le")
                for s in fam.samples:
                    labels.setdefault(s.name, set()).update(s.labels)
    for name in SYNTHETIC:
        labels[name] = set()
    exprs = _expressions()
    assert len(exprs) >= 20
    for where, expr in exprs:
        metrics = set(_METRIC.findall(expr))
        assert metrics, f"{where}: no metric in {expr!r}"
        missing = metrics - set(labels)
        assert not missing, f"{where}: {sorted(missing)} exported by no program"
        allowed = set().union(*(labels[m] for m in metrics)) | TARGET_LABELS
        used = {m.split("=")[0].split("!")[0].strip() for body in _MATCHER.findall(expr)
                for m in body.split(",") if m.strip()}
        used |= {lbl.strip() for body in _GROUPING.findall(expr) for lbl in body.split(",") if lbl.strip()}
        assert used <= allowed, f"{where}: labels {sorted(used - allowed)} not on {sorted(metrics)}"


async def test_coordinator_state_metrics(fleet: UpFleet) -> None:
    programs = _status_json(fleet)["programs"]

    async def scrape() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        async with aiohttp.ClientSession() as http, http.get(programs["coordinator"]["metrics"]) as resp:
            return _samples(await resp.text())

    s = await wait_for(lambda: _registered(scrape), timeout=20, what="both instances in the registry")
    assert _value(s, "motor_coordinator_registry_generation") >= 1
    assert _value(s, "motor_coordinator_registry_authoritative") == 1
    assert _value(s, "motor_coordinator_election_role", role="standalone") == 1
    assert _value(s, "motor_coordinator_election_role", role="master") == 0
    assert _value(s, "motor_coordinator_isolated") == 0


async def _registered(scrape: Any) -> Any:
    s = await scrape()
    return s if _value(s, "motor_coordinator_registry_instances") == 2 else None


async def test_instance_in_flight_moves_while_a_stream_is_served(fleet: UpFleet) -> None:
    programs = _status_json(fleet)["programs"]
    url = programs["coordinator"]["metrics"]

    async def decode_in_flight() -> float:
        async with aiohttp.ClientSession() as http, http.get(url) as resp:
            return _value(_samples(await resp.text()), "motor_coordinator_instance_requests_in_flight",
                          role="decode", model="tiny")

    await wait_for(lambda: _registered(lambda: _scrape(url)), timeout=20, what="both instances registered")
    assert await decode_in_flight() == 0
    client = openai.AsyncOpenAI(base_url=fleet.info["gateway_url"] + "/v1", api_key="unused",
                                max_retries=0, timeout=30)
    stream = await client.completions.create(model="tiny", prompt="Tell a long story", max_tokens=400,
                                             stream=True)
    it = stream.__aiter__()
    await it.__anext__()  # the decode engine is streaming now
    assert await decode_in_flight() == 1
    async for _ in it:
        pass
    await wait_for(lambda: _zero(decode_in_flight), timeout=10, what="in flight back to 0")


async def _scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        return _samples(await resp.text())


async def _zero(get: Any) -> bool:
    return bool(await get() == 0)


async def test_a_failed_kv_handoff_moves_the_retry_counter_and_the_request_still_succeeds(fleet: UpFleet) -> None:
    """Fault on the fleet's decode engine (its next KV load fails, as a timed-out NIXL handshake
    does on vLLM): the coordinator runs the hand-off again, the client gets its answer, and
    motor_coordinator_retries_total{reason="kv_handoff_failed"} shows it."""
    status = _status_json(fleet)
    decode = next(i for i in status["instances"] if i["role"] == "decode")
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://{decode['endpoints'][0]}/sim/fault",
                             json={"mode": "kv_load_fail", "count": 1}) as resp:
            assert resp.status == 200, await resp.text()
        client = openai.AsyncOpenAI(base_url=fleet.info["gateway_url"] + "/v1", api_key="unused",
                                    max_retries=0, timeout=30)
        resp_ = await client.completions.create(model="tiny", prompt="Hello, Motor", max_tokens=4)
        assert resp_.choices[0].text
        async with http.get(status["programs"]["coordinator"]["metrics"]) as resp:
            s = _samples(await resp.text())
    retried = dict(model="tiny", role="decode", reason="kv_handoff_failed")
    assert _value(s, "motor_coordinator_retries_total", **retried) == 1
    assert _value(s, "motor_coordinator_failovers_total", **retried) == 0  # the fleet's only decode
    assert _value(s, "motor_coordinator_pd_phase_duration_seconds_count", model="tiny", phase="prefill") == 2
    assert _value(s, "motor_coordinator_requests_total", model="tiny", outcome="success") == 1
