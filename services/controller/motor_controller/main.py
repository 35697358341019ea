"""``motor-controller --config FILE [--ports-file PATH]``.

Start order: config → logging → store → state load → gRPC server → reconcile loop and pushers →
ports file. SIGTERM/SIGINT: unready, stop background tasks, drain the server, close the store.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from collections.abc import Callable

from prometheus_client import REGISTRY

from motor_common.channel_pool import ChannelPool
from motor_common.config import load_config
from motor_common.credentials import Role, presented_key
from motor_common.errors import ConfigError, Internal
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbgrpc
from motor_common.grpc_server import GrpcServer
from motor_common.logs import setup_logging
from motor_common.ops_http import OpsHttpServer, Readiness, ops_server
from motor_common.runner import (
    DOCS_HINT,
    check_config,
    run,
    stop_event_on_signals,
    write_ports_file,
)
from motor_common.version import add_version_flag
from motor_controller import metrics as controller_metrics
from motor_controller.alarm_webhook import AlarmWebhook
from motor_controller.config import ControllerConfig
from motor_controller.controller import Controller
from motor_controller.node_restarter import build_restarter
from motor_controller.peers import GrpcCoordinator, GrpcNodeManagers
from motor_controller.scale_down_client import GrpcScaleDown
from motor_controller.service import (
    ADMIN_SERVICE,
    CONTROLLER_SERVICE,
    ControllerAdminServicer,
    ControllerServicer,
)
from motor_controller.store import open_store

log = logging.getLogger("motor_controller")



def build_server(
    config: ControllerConfig, controller: Controller, key: str | None, gate: Callable[[], None] | None = None
) -> GrpcServer:
    server = GrpcServer("controller", config.server, management_key=key)
    g: Callable[[], None] = gate or (lambda: None)
    server.add_service(
        CONTROLLER_SERVICE,
        lambda s: pbgrpc.add_ControllerServiceServicer_to_server(
            ControllerServicer(controller, g), s
        ),
        role=Role.NODE,
    )
    server.add_service(
        ADMIN_SERVICE,
        lambda s: pbgrpc.add_ControllerAdminServiceServicer_to_server(
            ControllerAdminServicer(controller, g), s
        ),
        protected=True,
    )
    return server


async def _ready_always() -> tuple[bool, str]:
    return True, "ok"


async def start_ops(config: ControllerConfig, readiness: Readiness) -> OpsHttpServer | None:
    """``/metrics``, ``/health`` and ``/ready`` when ``server.metrics_port`` is set (HTTP or
    HTTPS: ``server.ops_tls``)."""
    ops = ops_server(config.server, readiness)
    if ops is not None:
        await ops.start()
    return ops


def start_alarm_webhook(config: ControllerConfig, controller: Controller) -> AlarmWebhook | None:
    """Deliver the controller's alarms to ``alarms.webhook_url`` (None when it is not set)."""
    if not config.alarms.webhook_url:
        return None
    webhook = AlarmWebhook(config.alarms)
    controller.on_alarm = webhook.notify
    webhook.start()
    return webhook


# Load failures of the embedded store that a restart cannot mend (the operator must repair the
# record or run the version that wrote it).
UNLOADABLE = ("STORE_RECORD_UNREADABLE", "STORE_FORMAT_NEWER")


async def serve(config: ControllerConfig, ports_file: str | None) -> int:
    from motor_common.grpc_server import read_secret

    key = read_secret(config.server.management_key_file)
    if config.store.backend == "etcd":
        return await serve_ha(config, ports_file, key)
    tls = config.server.tls
    out_key = presented_key(config.server.auth, key)  # this controller's operator credential
    pool = ChannelPool(tls)  # the nodemanagers' channels, shared by both of their services
    nms = GrpcNodeManagers(out_key, config.rpc_timeout_sec, pool=pool)
    restarter = build_restarter(config.node_restart, nms)  # ConfigError (exit 2) before any I/O
    store = await open_store(config.store.backend, config.store.path)
    controller = Controller(
        config,
        store,
        nms,
        [GrpcCoordinator(a, out_key, config.rpc_timeout_sec, tls) for a in config.coordinators],
        restarter=restarter,
        coordinator_factory=lambda a: GrpcCoordinator(a, out_key, config.rpc_timeout_sec, tls),
        scale_down_peers=GrpcScaleDown(out_key, pool=pool),
    )
    try:
        await controller.load()
    except Internal as exc:
        await controller.close()
        await store.close()
        if exc.reason in UNLOADABLE:  # a restart cannot help: one sentence, exit 2, no restart loop
            raise ConfigError(f"store {config.store.path}: {exc.message}", reason=exc.reason) from exc
        raise
    server = build_server(config, controller, key)
    stop = stop_event_on_signals()
    port = await server.start()
    controller.start()
    ops = await start_ops(config, _ready_always)
    collector = controller_metrics.register(controller)
    webhook = start_alarm_webhook(config, controller)
    if ports_file:
        write_ports_file(ports_file, {"grpc": port, "metrics": ops.port if ops else None})
    log.info("motor-controller ready", extra={"port": port, "coordinators": config.coordinators,
                                              "node_restart": restarter.name})
    try:
        await stop.wait()
    finally:
        log.info("motor-controller stopping")
        await server.set_serving(False)
        await controller.close()
        await server.stop()
        if ops is not None:
            await ops.stop()
        REGISTRY.unregister(collector)
        if webhook is not None:
            await webhook.close()
        await store.close()
    return 0


async def serve_ha(config: ControllerConfig, ports_file: str | None, key: str | None) -> int:
    """etcd store + controller election: act only while holding ``ha.election_key``."""
    from motor_common.etcd_election import EtcdElection
    from motor_controller.election import ControllerLeader
    from motor_controller.etcd_store import EtcdStore

    ha, st = config.ha, config.store
    tls = config.server.tls
    out_key = presented_key(config.server.auth, key)  # this controller's operator credential
    pool = ChannelPool(tls)  # the nodemanagers' channels, shared by both of their services
    nms = GrpcNodeManagers(out_key, config.rpc_timeout_sec, pool=pool)
    restarter = build_restarter(config.node_restart, nms)  # ConfigError (exit 2) before any I/O
    store = EtcdStore(st.etcd_endpoints, st.etcd_prefix, timeout=st.etcd_timeout_sec)
    controller = Controller(
        config,
        store,
        nms,
        [GrpcCoordinator(a, out_key, config.rpc_timeout_sec, tls) for a in config.coordinators],
        restarter=restarter,
        coordinator_factory=lambda a: GrpcCoordinator(a, out_key, config.rpc_timeout_sec, tls),
        scale_down_peers=GrpcScaleDown(out_key, pool=pool),
    )
    server = build_server(config, controller, key, gate=lambda: leader.check())
    leader = ControllerLeader(controller, server, "controller")
    stop = stop_event_on_signals()
    port = await server.start()
    await server.set_serving(False)  # standby until the election says otherwise
    advertise = ha.advertise_address or f"{config.server.host}:{port}"
    candidate = ha.candidate_id or f"{advertise}@{socket.gethostname()}:{os.getpid()}"
    leader.source = f"controller@{advertise}"
    store.fence = (ha.election_key, candidate)
    store.on_status = leader.store_status
    election = EtcdElection(st.etcd_endpoints, ha.election_key, candidate, ttl=ha.lock_ttl_sec,
                            check_interval=ha.check_interval_sec, on_change=leader.on_change,
                            call_timeout=min(1.0, st.etcd_timeout_sec), may_acquire=leader.may_acquire)  # fmt: skip
    leader.current = election.current
    await election.start()

    async def acting() -> tuple[bool, str]:
        return leader.readiness()

    ops = await start_ops(config, acting)
    collector = controller_metrics.register(controller)
    webhook = start_alarm_webhook(config, controller)
    if ports_file:
        write_ports_file(ports_file, {"grpc": port, "metrics": ops.port if ops else None})
    log.info("motor-controller ready (etcd store, election)",
             extra={"port": port, "candidate": candidate, "election_key": ha.election_key})  # fmt: skip
    try:
        await stop.wait()
    finally:
        log.info("motor-controller stopping")
        await server.set_serving(False)
        await controller.close()
        await election.stop(resign=True)  # a standby takes over at once
        await server.stop()
        if ops is not None:
            await ops.stop()
        REGISTRY.unregister(collector)
        if webhook is not None:
            await webhook.close()
        await store.close()
    return 0


HELP = """Motor controller: the node registry of a managed fleet. Nodemanagers register with it and
stream heartbeats; it assembles instances, pushes them to the coordinators, handles faults and
keeps its state in a store (an embedded file, or etcd with leader election).

  motor-controller --config controller.yaml
  motor-controller --config controller.yaml --port 9200 --check-config
  MOTOR_CONTROLLER__SERVER__PORT=9201 motor-controller --config controller.yaml
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="motor-controller", description=HELP,
                                     epilog="Config keys: docs/controller.md. " + DOCS_HINT,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version_flag(parser)
    parser.add_argument("--config", required=False, help="YAML or JSON config file (unknown keys are rejected)")
    parser.add_argument("--port", type=int, help="gRPC port (overrides server.port; 0 = any)")
    parser.add_argument("--ports-file", help="write {\"grpc\": port} here once listening")
    parser.add_argument("--check-config", action="store_true",
                        help="validate the configuration and exit (0 valid, 2 invalid); starts nothing")
    args = parser.parse_args(argv)
    overrides = {"server": {"port": args.port}} if args.port is not None else None

    def load() -> ControllerConfig:
        return load_config(ControllerConfig, args.config, env_prefix="MOTOR_CONTROLLER", overrides=overrides)

    if args.check_config:
        return check_config(load)

    async def _main() -> int:
        config = load()
        setup_logging("controller", config.log.level, config.log.format)
        return await serve(config, args.ports_file)

    return run(_main)


if __name__ == "__main__":
    raise SystemExit(main())
