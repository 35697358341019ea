"""``motor-controller --config FILE [--ports-file PATH]``.

Start order: config → logging → store → state load → gRPC server → reconcile loop and pushers →
ports file. SIGTERM/SIGINT: unready, stop background tasks, drain the server, close the store.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
from pathlib import Path

import orjson

from motor_common.config import load_config
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbgrpc
from motor_common.grpc_server import GrpcServer
from motor_common.logs import setup_logging
from motor_common.runner import run, stop_event_on_signals
from motor_controller.config import ControllerConfig
from motor_controller.controller import Controller
from motor_controller.peers import GrpcCoordinator, GrpcNodeManagers
from motor_controller.service import (
    ADMIN_SERVICE,
    CONTROLLER_SERVICE,
    ControllerAdminServicer,
    ControllerServicer,
)
from motor_controller.store import open_store

log = logging.getLogger("motor_controller")


def write_ports_file(path: str, ports: dict[str, int]) -> None:
    """Write ``{"grpc": port}`` atomically (temp file + rename in the same directory)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "wb") as fh:
        fh.write(orjson.dumps(ports))
    os.replace(tmp, target)


def build_server(config: ControllerConfig, controller: Controller, key: str | None) -> GrpcServer:
    server = GrpcServer("controller", config.server, management_key=key)
    server.add_service(
        CONTROLLER_SERVICE,
        lambda s: pbgrpc.add_ControllerServiceServicer_to_server(  # type: ignore[no-untyped-call]
            ControllerServicer(controller), s
        ),
        protected=True,
    )
    server.add_service(
        ADMIN_SERVICE,
        lambda s: pbgrpc.add_ControllerAdminServiceServicer_to_server(  # type: ignore[no-untyped-call]
            ControllerAdminServicer(controller), s
        ),
        protected=True,
    )
    return server


async def serve(config: ControllerConfig, ports_file: str | None) -> int:
    from motor_common.grpc_server import read_secret

    key = read_secret(config.server.management_key_file)
    store = await open_store(config.store.backend, config.store.path)
    controller = Controller(
        config,
        store,
        GrpcNodeManagers(key, config.rpc_timeout_sec),
        [GrpcCoordinator(a, key, config.rpc_timeout_sec) for a in config.coordinators],
        coordinator_factory=lambda a: GrpcCoordinator(a, key, config.rpc_timeout_sec),
    )
    await controller.load()
    server = build_server(config, controller, key)
    stop = stop_event_on_signals()
    port = await server.start()
    controller.start()
    if ports_file:
        write_ports_file(ports_file, {"grpc": port})
    log.info("motor-controller ready", extra={"port": port, "coordinators": config.coordinators})
    try:
        await stop.wait()
    finally:
        log.info("motor-controller stopping")
        await server.set_serving(False)
        await controller.close()
        await server.stop()
        await store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="motor-controller", description="Motor controller")
    parser.add_argument("--config", required=False, help="YAML or JSON config file")
    parser.add_argument("--ports-file", help="write {\"grpc\": port} here once listening")
    args = parser.parse_args(argv)

    async def _main() -> int:
        config = load_config(ControllerConfig, args.config, env_prefix="MOTOR_CONTROLLER")
        setup_logging("controller", config.logging.level, config.logging.format)
        return await serve(config, args.ports_file)

    return run(_main)


if __name__ == "__main__":
    raise SystemExit(main())
