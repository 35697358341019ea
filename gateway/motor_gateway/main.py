"""``motor-gateway``: the OpenAI-compatible HTTP front of a Motor deployment.

    motor-gateway --coordinator 127.0.0.1:9100 --port 8000
    motor-gateway --config gateway.yaml --ports-file /tmp/gw.ports   # writes {"http": <port>}
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from motor_common.config import load_config
from motor_common.errors import ConfigError
from motor_common.logs import setup_logging
from motor_common.runner import run, stop_event_on_signals
from motor_gateway.app import Gateway
from motor_gateway.config import GatewayConfig
from motor_gateway.pool import CoordinatorPool

log = logging.getLogger("motor_gateway")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="motor-gateway", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML or JSON config file (keys of GatewayConfig)")
    p.add_argument("--host", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default 8000; 0 = any)")
    p.add_argument("--coordinator", action="append", metavar="ADDR",
                   help="coordinator gRPC address host:port (repeatable, first ready one serves)")
    p.add_argument("--ports-file", help="after start, write {\"http\": <port>} to this file")
    p.add_argument("--log-format", choices=("json", "text"), help="overrides log_format")
    return p.parse_args(argv)


def read_api_key(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"cannot read API key file {path}: {exc.strerror}") from exc
    if not key:
        raise ConfigError(f"API key file {path} is empty")
    return key


def write_ports_file(path: str, ports: dict[str, int]) -> None:
    """Write *ports* as JSON atomically (temp file + rename), so readers never see half a file."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(orjson.dumps(ports))
    os.replace(tmp, target)


def build_config(args: argparse.Namespace) -> GatewayConfig:
    overrides: dict[str, Any] = {}
    if args.host is not None:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    if args.coordinator:
        overrides["coordinators"] = list(args.coordinator)
    if args.log_format is not None:
        overrides["log_format"] = args.log_format
    return load_config(GatewayConfig, args.config, env_prefix="MOTOR_GATEWAY", overrides=overrides)


async def serve(cfg: GatewayConfig, ports_file: str | None = None,
                stop: asyncio.Event | None = None) -> int:
    api_key = read_api_key(cfg.api_key_file)
    pool = CoordinatorPool(cfg.coordinators, tls_ca_file=cfg.tls_ca_file,
                           timeout=cfg.control_timeout_sec, probe_interval=cfg.probe_interval_sec,
                           probe_timeout=cfg.probe_timeout_sec, failover_timeout=cfg.failover_timeout_sec,
                           dispatch_attempts=cfg.dispatch_attempts)
    gateway = Gateway(pool, request_timeout=cfg.request_timeout_sec,
                      control_timeout=cfg.control_timeout_sec, api_key=api_key)
    runner = web.AppRunner(gateway.make_app(), access_log=None, handler_cancellation=True,
                           shutdown_timeout=cfg.shutdown_grace_sec)
    await runner.setup()
    try:
        site = web.TCPSite(runner, cfg.host, cfg.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(f"cannot listen on {cfg.host}:{cfg.port}: {exc.strerror}") from exc
        sockets = getattr(site._server, "sockets", None)
        port = int(sockets[0].getsockname()[1]) if sockets else cfg.port
        pool.start()
        if ports_file:
            write_ports_file(ports_file, {"http": port})
        log.info("gateway listening", extra={"address": f"{cfg.host}:{port}",
                                             "coordinators": list(cfg.coordinators)})
        stop = stop or stop_event_on_signals()
        await stop.wait()
        log.info("gateway stopping")
    finally:
        await runner.cleanup()
        await pool.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    async def _main() -> int:
        cfg = build_config(args)
        setup_logging("gateway", cfg.log_level, cfg.log_format)
        return await serve(cfg, args.ports_file)

    return run(_main)


if __name__ == "__main__":
    sys.exit(main())
