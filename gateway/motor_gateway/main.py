"""motor-gateway: the OpenAI-compatible HTTP front of a Motor deployment (/v1/completions,
/v1/chat/completions, /v1/models, SSE), over the coordinators' Dispatch RPC. /health is liveness,
/ready readiness (503 with the reason while no coordinator can schedule).

  motor-gateway --coordinator 127.0.0.1:9100 --port 8000
  motor-gateway --coordinator 10.0.0.1:9100 --coordinator 10.0.0.2:9100   # active/standby pair
  motor-gateway --config gateway.yaml --check-config
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from motor_common.config import load_config
from motor_common.errors import ConfigError
from motor_common.grpc_server import read_secret
from motor_common.logs import setup_logging
from motor_common.openai_front.app import Gateway, read_api_key, start_site
from motor_common.ports import bind_failure
from motor_common.runner import (
    DOCS_HINT,
    check_config,
    run,
    stop_event_on_signals,
    write_ports_file,
)
from motor_common.tls import https_context
from motor_common.tracing import reset_tracing, setup_tracing
from motor_common.version import add_version_flag
from motor_gateway.client import GrpcDispatchClient
from motor_gateway.config import GatewayConfig
from motor_gateway.pool import CoordinatorPool

log = logging.getLogger("motor_gateway")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="motor-gateway", description=__doc__,
                                epilog="Config keys: the GatewayConfig fields in gateway/motor_gateway/config.py; "
                                "HA: docs/ha.md. " + DOCS_HINT,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version_flag(p)
    p.add_argument("--config", help="YAML or JSON config file (keys of GatewayConfig)")
    p.add_argument("--host", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default 8000; 0 = any)")
    p.add_argument("--coordinator", action="append", metavar="ADDR",
                   help="coordinator gRPC address host:port (repeatable, first ready one serves)")
    p.add_argument("--ports-file", help="after start, write {\"http\": <port>} to this file")
    p.add_argument("--log-format", choices=("json", "text"), help="overrides log.format")
    p.add_argument("--workers", type=int, help="HTTP worker processes sharing the port via SO_REUSEPORT "
                   "(default 1 = this process serves)")
    p.add_argument("--check-config", action="store_true",
                   help="validate the configuration and exit (0 valid, 2 invalid); starts nothing")
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)  # set for workers
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> GatewayConfig:
    overrides: dict[str, Any] = {}
    if args.host is not None:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    if args.coordinator:
        overrides["coordinators"] = list(args.coordinator)
    if args.log_format is not None:
        overrides["log"] = {"format": args.log_format}
    if args.workers is not None:
        overrides["workers"] = args.workers
    return load_config(GatewayConfig, args.config, env_prefix="MOTOR_GATEWAY", overrides=overrides)


async def serve(cfg: GatewayConfig, ports_file: str | None = None,
                stop: asyncio.Event | None = None, *, reuse_port: bool = False) -> int:
    api_key = read_api_key(cfg.api_key_file)
    # The gateway's own credential for the coordinators' DispatchService.
    credential = read_secret(cfg.coordinator_key_file, "coordinator key")
    pool = CoordinatorPool(cfg.coordinators, tls=cfg.tls, tls_ca_file=cfg.tls_ca_file,
                           timeout=cfg.control_timeout_sec, probe_interval=cfg.probe_interval_sec,
                           probe_timeout=cfg.probe_timeout_sec, failover_timeout=cfg.failover_timeout_sec,
                           dispatch_attempts=cfg.dispatch_attempts, multiplex=cfg.multiplex)
    client = GrpcDispatchClient(pool, request_timeout=cfg.request_timeout_sec,
                                control_timeout=cfg.control_timeout_sec, credential=credential)
    try:
        app = Gateway(client, api_key=api_key, limits=cfg.limits, admission=cfg.admission).make_app()
        runner, port = await start_site(app, cfg.host, cfg.port, shutdown_timeout=cfg.shutdown_grace_sec,
                                        reuse_port=reuse_port, limits=cfg.limits,
                                        ssl_context=https_context(cfg.https) if cfg.https.serves_tls else None)
    except BaseException:
        await pool.close()
        raise
    try:
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


def _die_with_parent() -> None:
    """Workers get SIGTERM when the supervising process dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def _reserve_port(host: str, port: int) -> socket.socket:
    """Bind (not listen) a SO_REUSEPORT socket: fixes the port for the workers (port 0 = any)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(bind_failure(host, port, detail=exc.strerror or "")) from exc
    return sock


def supervise(cfg: GatewayConfig, argv: list[str], ports_file: str | None) -> int:
    """Run ``cfg.workers`` copies of this program on one port (SO_REUSEPORT); forward
    SIGTERM/SIGINT; exit when they have all exited (non-zero if any worker failed)."""
    reserved = _reserve_port(cfg.host, cfg.port)
    port = int(reserved.getsockname()[1])
    tmp = tempfile.mkdtemp(prefix="motor-gateway-")
    base = [a for a in argv]
    workers: list[subprocess.Popen[bytes]] = []
    files = [os.path.join(tmp, f"w{i}.json") for i in range(cfg.workers)]
    for i in range(cfg.workers):
        cmd = [sys.executable, "-m", "motor_gateway.main", *base, "--workers", "1", "--reuse-port",
               "--port", str(port), "--ports-file", files[i]]
        workers.append(subprocess.Popen(cmd, preexec_fn=_die_with_parent))
    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for w in workers:
            if w.poll() is None:
                w.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    written = False
    try:
        while True:
            codes = [w.poll() for w in workers]
            if all(c is not None for c in codes):
                break
            if any(c is not None for c in codes) and not stopping:
                log.error("a gateway worker exited; stopping the others", extra={"codes": codes})
                forward(signal.SIGTERM, None)
            if not written and ports_file and all(os.path.exists(f) for f in files):
                write_ports_file(ports_file, {"http": port})
                written = True
            time.sleep(0.05)
    finally:
        reserved.close()
        for f in files:
            with contextlib.suppress(OSError):
                os.unlink(f)
        with contextlib.suppress(OSError):
            os.rmdir(tmp)
    codes = [w.returncode for w in workers]
    return next((c for c in codes if c), 0)


def _strip(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """*argv* without *flags* and their values (``--flag V`` or ``--flag=V``)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in flags:
            skip = True
            continue
        if any(a.startswith(f + "=") for f in flags):
            continue
        out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(raw)
    if args.check_config:
        return check_config(lambda: build_config(args))
    if not args.reuse_port:
        try:
            cfg = build_config(args)
        except ConfigError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            return 2
        if cfg.workers > 1:
            setup_logging("gateway", cfg.log.level, cfg.log.format)
            try:
                return supervise(cfg, _strip(raw, ("--workers", "--port", "--ports-file")), args.ports_file)
            except ConfigError as exc:
                print(f"error: {exc.message}", file=sys.stderr)
                return 2

    async def _main() -> int:
        cfg = build_config(args)
        setup_logging("gateway", cfg.log.level, cfg.log.format)
        setup_tracing(cfg.tracing, "gateway")
        try:
            return await serve(cfg, args.ports_file, reuse_port=args.reuse_port)
        finally:
            reset_tracing()  # exports the spans not sent yet

    return run(_main)


if __name__ == "__main__":
    sys.exit(main())
