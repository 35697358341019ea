"""motor status: nodes and instances of a managed fleet, from the controller.

    motor status                      # the fleet `motor up` runs in ./.motor/up
    motor status --controller 10.0.0.5:9200 --management-key-file key
    motor status --json | jq '.instances[].id'

Shows every node (role, state, instance, endpoint health, heartbeat age) and every instance
(role, state, endpoints, reason), and — asking the coordinators (--coordinator, default the
fleet's) — every model served by one side of its prefill/decode pair alone (DEGRADED). A controller that is not acting — isolated from its store (etcd
down: STORE_UNAVAILABLE alarm) or a standby — is said so first, with what it cannot do meanwhile;
its node and instance lists are then its last known view, not live state.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from motor_cli import output, target
from motor_cli.served_alone import served_alone
from motor_cli.tls_args import add_tls_flags, tls_from_args
from motor_common.errors import MotorError
from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbg
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.grpc_server import read_secret
from motor_common.tls import TlsConfig

EXIT_FAILED = 1


def _enum(enum_type: Any, value: int, prefix: str) -> str:
    return str(enum_type.Name(value)).removeprefix(prefix).lower()


@dataclass
class FleetView:
    """What the controller reports; ``error`` set when it could not be asked."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    instances: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    # False: the controller answers but does not act (standby, or isolated from its store).
    acting: bool = True
    # Message of an active STORE_UNAVAILABLE alarm ("" = the store is reachable).
    store_unavailable: str = ""
    # Message of an active STATE_LOAD_FAILED alarm ("" = the controller's state loads).
    state_load_failed: str = ""

    @property
    def isolation(self) -> str:
        """What an operator must know when the controller does not act ("" when it does)."""
        if self.acting and not self.store_unavailable:
            return ""
        if self.store_unavailable:
            why = f"controller ISOLATED: store unavailable ({self.store_unavailable})"
        elif self.state_load_failed:
            why = f"controller NOT ACTING: its state cannot be loaded ({self.state_load_failed})"
        else:
            why = "controller NOT ACTING (standby: another controller holds the lock)"
        return (why + "; meanwhile no node registration, heartbeat intake, fault recovery or instance change "
                "reaches the coordinators — engines and coordinators keep serving what they have; node and "
                "instance states below are the last known, not live")

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def active(self) -> int:
        return sum(1 for i in self.instances if i["state"] == "active")

    def expected(self, node_count: int) -> int:
        """Instances a fleet of single-node instances should have."""
        return node_count


async def fetch_view(address: str, key: str | None, timeout: float = 2.0, tls: TlsConfig | None = None) -> FleetView:
    md = call_metadata(key)
    try:
        async with open_channel(address, tls=tls) as channel:
            stub = pbg.ControllerAdminServiceStub(channel)
            nodes = await stub.ListNodes(pb.ListNodesRequest(), metadata=md, timeout=timeout)
            insts = await stub.ListInstances(pb.ListInstancesRequest(), metadata=md, timeout=timeout)
            alarms = pb.ListAlarmsResponse()
            while True:  # every page
                page = await stub.ListAlarms(pb.ListAlarmsRequest(active_only=True, page_token=alarms.next_page_token),
                                             metadata=md, timeout=timeout)
                alarms.alarms.extend(page.alarms)
                alarms.next_page_token = page.next_page_token
                if not page.next_page_token:
                    break
            health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                                     timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        return FleetView(error=f"controller {address}: {exc.code().name}: {exc.details()}")
    now = time.time()
    view = FleetView(acting=health.status == health_pb2.HealthCheckResponse.SERVING)
    view.store_unavailable = next((a.message or "store unavailable" for a in alarms.alarms
                                   if a.kind == pb.ALARM_KIND_STORE_UNAVAILABLE), "")
    view.state_load_failed = next((a.message or "state load failed" for a in alarms.alarms
                                   if a.kind == pb.ALARM_KIND_STATE_LOAD_FAILED), "")
    for n in nodes.nodes:
        hb = n.last_heartbeat_at.ToSeconds() + n.last_heartbeat_at.nanos / 1e9 if n.HasField("last_heartbeat_at") else None
        view.nodes.append(
            {
                "node_id": n.spec.node_id,
                "role": _enum(tpb.Role, n.spec.role, "ROLE_"),
                "job": n.spec.job_name,
                "state": _enum(pb.NodeState, n.state, "NODE_STATE_"),
                "instance_id": n.instance_id,
                "endpoints": [
                    {"id": e.endpoint_id, "status": _enum(tpb.EndpointStatus, e.status, "ENDPOINT_STATUS_"), "pid": e.pid}
                    for e in n.endpoints
                ],
                "address": f"{n.spec.ip}:{n.spec.admin_port}",
                "heartbeat_age_sec": round(now - hb, 1) if hb else None,
            }
        )
    for m in insts.instances:
        inst = m.instance
        view.instances.append(
            {
                "id": inst.id,
                "role": _enum(tpb.Role, inst.role, "ROLE_"),
                "job": inst.job_name,
                "model": inst.model_name,
                "state": _enum(pb.InstanceState, m.state, "INSTANCE_STATE_"),
                "endpoints": [f"{e.ip}:{e.business_port}" for e in inst.endpoints],
                "nodes": list(m.node_ids),
                "reason": m.reason,
                "paused": m.paused,
                "pause_reason": m.pause_reason,
            }
        )
    return view


def format_line(view: FleetView) -> str:
    """One compact status line, e.g. ``nodes 2/2 running · instances 2/2 active (prefill 1, decode 1)``."""
    if not view.ok:
        return f"controller unreachable ({view.error})"
    running = sum(1 for n in view.nodes if n["state"] == "running")
    by_role: dict[str, int] = {}
    for inst in view.instances:
        if inst["state"] == "active":
            by_role[inst["role"]] = by_role.get(inst["role"], 0) + 1
    roles = ", ".join(f"{r} {c}" for r, c in sorted(by_role.items()))
    others = [f"{i['role']}#{i['job']} {i['state']}" for i in view.instances if i["state"] != "active"]
    others += [f"{i['role']}#{i['job']} paused" for i in view.instances if i["state"] == "active" and i.get("paused")]
    line = f"nodes {running}/{len(view.nodes)} running · instances {view.active}/{len(view.instances)} active"
    if roles:
        line += f" ({roles})"
    if others:
        line += " · " + ", ".join(others)
    if view.isolation:
        line = f"{view.isolation} · last known: {line}"
    return line


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", default=target.DEFAULT_STATE_DIR,
                        help="fleet started by `motor up` (default %(default)s)")
    parser.add_argument("--controller", metavar="ADDR",
                        help="controller address (env MOTOR_CONTROLLER; default: the fleet in --state-dir)")
    parser.add_argument("--management-key-file", metavar="FILE",
                        help="management key (env MOTOR_MANAGEMENT_KEY_FILE; default: the fleet's)")
    parser.add_argument("--coordinator", metavar="ADDR", action="append",
                        help="a coordinator to ask which models one side of their pair serves alone "
                             "(repeatable; env MOTOR_COORDINATOR; default: the fleet's in --state-dir)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_tls_flags(parser)


def run(args: argparse.Namespace) -> int:
    try:
        address = target.controller_address(args.controller, args.state_dir)
        key_file = target.management_key_file(args.management_key_file, args.state_dir)
        key = read_secret(key_file) if key_file else None
        tls = tls_from_args(args, {"tls": target.tls_section(args.state_dir)})
    except MotorError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    # the fleet's programs, coordinators and ops URLs, when the controller asked is the `motor up` fleet's
    ours = args.controller is None and not os.environ.get("MOTOR_CONTROLLER")
    coordinators = target.coordinator_addresses(args.coordinator, args.state_dir if ours else None)

    async def ask() -> tuple[FleetView, list[str]]:
        view = await fetch_view(address, key, tls=tls)
        return view, (await served_alone(coordinators, tls) if view.ok and coordinators else [])

    view, alone = asyncio.run(ask())
    if not view.ok:
        print(f"error: {view.error}", file=sys.stderr)
        return EXIT_FAILED
    programs = ops_urls(args.state_dir) if ours else {}
    shape = topology(args.state_dir) if ours else None
    if args.json:
        print(json.dumps({"controller": {"acting": view.acting, "store_unavailable": view.store_unavailable,
                                         "isolation": view.isolation},
                          "nodes": view.nodes, "instances": view.instances, "served_alone": alone,
                          "programs": programs, "topology": shape}, indent=2))
        return 0
    print(format_line(view) + ("; DEGRADED, served alone: " + ", ".join(alone) if alone else ""))
    if shape is not None:
        workers = f" ({shape['workers']} worker processes)" if shape["workers"] > 1 else ""
        print(f"topology: {shape['description']}; OpenAI front {shape['url']}/v1{workers}")
    print()
    print(
        output.grid(
            ["NODE", "ROLE", "STATE", "INSTANCE", "ENDPOINTS", "HEARTBEAT", "ADDRESS"],
            [
                [
                    n["node_id"],
                    n["role"],
                    n["state"],
                    str(n["instance_id"] or "-"),
                    " ".join(f"{e['id']}:{e['status']}" for e in n["endpoints"]) or "-",
                    f"{n['heartbeat_age_sec']}s ago" if n["heartbeat_age_sec"] is not None else "never",
                    n["address"],
                ]
                for n in view.nodes
            ],
        )
    )
    print()
    print(
        output.grid(
            ["INSTANCE", "ROLE", "STATE", "JOB", "MODEL", "ENDPOINTS", "REASON"],
            [
                [str(i["id"]), i["role"], i["state"] + (", paused" if i["paused"] else ""), i["job"], i["model"],
                 " ".join(i["endpoints"]), (f"paused: {i['pause_reason']}; " if i["paused"] else "") + (i["reason"] or "")]
                for i in view.instances
            ],
        )
    )
    if programs:
        print()
        print(output.grid(["PROGRAM", "KIND", "METRICS", "HEALTH", "READY"],
                          [[name, p["kind"] or "-", p["metrics"] or "-", p["health"] or "-", p["ready"] or "-"]
                           for name, p in programs.items()]))
    return 0


def ops_urls(state_dir: str) -> dict[str, dict[str, str | None]]:
    """Every program of the running `motor up` fleet in *state_dir* with the URLs of its ops
    endpoint (/metrics, /health = liveness, /ready = readiness); None while not yet bound."""
    fleet = target.running_fleet(state_dir)
    if fleet is None or not fleet.alive:
        return {}
    out: dict[str, dict[str, str | None]] = {}
    for name, prog in (fleet.data.get("programs") or {}).items():
        if not isinstance(prog, dict) or prog.get("kind") == "etcd":
            continue
        base = prog.get("ops_url")
        base = base if isinstance(base, str) else None
        out[str(name)] = {"kind": str(prog.get("kind", "")),
                          **{ep: f"{base}/{ep}" if base else None for ep in ("metrics", "health", "ready")}}
    return out


def topology(state_dir: str) -> dict[str, Any] | None:
    """Which program serves the OpenAI front of the running `motor up` fleet in *state_dir*, and
    where: ``name`` (gateway / co-located), ``front`` (the program), ``description``, ``url``,
    ``workers`` (the front's worker processes: ``--gateway-workers`` / ``--front-workers``)."""
    fleet = target.running_fleet(state_dir)
    if fleet is None or not fleet.alive:
        return None
    shape = fleet.data.get("topology")
    if not isinstance(shape, dict):
        return None
    workers = shape.get("workers")
    return {**{k: str(shape.get(k, "")) for k in ("name", "front", "description")},
            "url": str(fleet.data.get("gateway_url", "")),
            "workers": workers if isinstance(workers, int) and workers > 0 else 1}
