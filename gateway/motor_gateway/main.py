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
import logging
import sys
from collections.abc import Callable
from typing import Any

from motor_common.config import load_config
from motor_common.credentials import PresentedKey, SecretFile
from motor_common.errors import ConfigError
from motor_common.logs import setup_logging
from motor_common.openai_front.app import Gateway, read_api_key, start_site
from motor_common.runner import (
    DOCS_HINT,
    check_config,
    run,
    stop_event_on_signals,
    write_ports_file,
)
from motor_common.tasks import TaskOwner
from motor_common.tls import https_context
from motor_common.tracing import reset_tracing, setup_tracing
from motor_common.version import add_version_flag
from motor_common.worker_policy import admission_share
from motor_common.worker_supervisor import (
    Command,
    WorkerNames,
    beat_forever,
    supervise,
    worker_registry,
)
from motor_gateway.client import GrpcDispatchClient
from motor_gateway.config import GatewayConfig
from motor_gateway.pool import CoordinatorPool

log = logging.getLogger("motor_gateway")

# With workers > 1 (motor_common.worker_supervisor): the supervisor's log lines and metrics.
WORKER_NAMES = WorkerNames(label="gateway", metric_prefix="motor_gateway", logger="motor_gateway.workers")


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
    p.add_argument("--worker-dir", help=argparse.SUPPRESS)  # the supervisor's state directory
    p.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--worker-count", type=int, default=1, help=argparse.SUPPRESS)  # the supervisor's workers
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
                stop: asyncio.Event | None = None, *, reuse_port: bool = False,
                worker_dir: str | None = None, worker_index: int = 0, worker_count: int = 1) -> int:
    """Serve until *stop* (SIGTERM/SIGINT). As worker *worker_index* of *worker_count* under a
    supervisor (*worker_dir*, ``motor_common.worker_supervisor``): heartbeats, ``/metrics`` of every
    worker, and this worker's share of the admission limits."""
    admission = admission_share(cfg.admission, worker_index, worker_count)
    api_key = read_api_key(cfg.api_key_file)
    # The gateway's own credential for the coordinators' DispatchService.
    credential = PresentedKey(SecretFile(cfg.coordinator_key_file, "coordinator key").current) \
        if cfg.coordinator_key_file else None
    pool = CoordinatorPool(cfg.coordinators, tls=cfg.tls, tls_ca_file=cfg.tls_ca_file,
                           timeout=cfg.control_timeout_sec, probe_interval=cfg.probe_interval_sec,
                           probe_timeout=cfg.probe_timeout_sec, failover_timeout=cfg.failover_timeout_sec,
                           dispatch_attempts=cfg.dispatch_attempts, multiplex=cfg.multiplex)
    client = GrpcDispatchClient(pool, request_timeout=cfg.request_timeout_sec,
                                control_timeout=cfg.control_timeout_sec, credential=credential)
    try:
        registry = worker_registry(worker_dir, WORKER_NAMES) if worker_dir else None
        app = Gateway(client, api_key=api_key, limits=cfg.limits, admission=admission,
                      metrics_registry=registry).make_app()
        runner, port = await start_site(app, cfg.host, cfg.port, shutdown_timeout=cfg.shutdown_grace_sec,
                                        reuse_port=reuse_port, limits=cfg.limits,
                                        ssl_context=https_context(cfg.https) if cfg.https.serves_tls else None)
    except BaseException:
        await pool.close()
        raise
    tasks = TaskOwner("gateway-worker")
    try:
        pool.start()
        if worker_dir:
            tasks.spawn(beat_forever(worker_dir, worker_index), name="heartbeat")
        if ports_file:
            write_ports_file(ports_file, {"http": port})
        log.info("gateway listening", extra={"address": f"{cfg.host}:{port}",
                                             "coordinators": list(cfg.coordinators),
                                             **({"worker": worker_index} if worker_dir else {})})
        stop = stop or stop_event_on_signals()
        await stop.wait()
        log.info("gateway stopping")
    finally:
        await runner.cleanup()  # stops listening, drains in-flight requests (shutdown_grace_sec)
        await tasks.close()
        await pool.close()
    return 0


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


def _worker_command(argv: list[str], workers: int) -> Callable[[int, str], Command]:
    """The command of each worker of ``motor-gateway --workers N``: this program with *argv*
    (without --workers/--port/--ports-file) as worker ``index`` of *workers* on the port the
    supervisor holds."""
    def command_for(port: int, state_dir: str) -> Command:
        def command(index: int, ports_file: str) -> list[str]:
            return [sys.executable, "-m", "motor_gateway.main", *argv, "--workers", "1", "--reuse-port",
                    "--port", str(port), "--ports-file", ports_file, "--worker-dir", state_dir,
                    "--worker-index", str(index), "--worker-count", str(workers)]
        return command
    return command_for


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
                return supervise(workers=cfg.workers, host=cfg.host, port=cfg.port, names=WORKER_NAMES,
                                 command_for=_worker_command(_strip(raw, ("--workers", "--port", "--ports-file")),
                                                             cfg.workers),
                                 ports_file=args.ports_file, liveness_timeout=cfg.worker_liveness_timeout_sec,
                                 shutdown_grace=cfg.shutdown_grace_sec)
            except ConfigError as exc:
                print(f"error: {exc.message}", file=sys.stderr)
                return 2

    async def _main() -> int:
        cfg = build_config(args)
        setup_logging("gateway", cfg.log.level, cfg.log.format)
        setup_tracing(cfg.tracing, "gateway")
        try:
            return await serve(cfg, args.ports_file, reuse_port=args.reuse_port,
                               worker_dir=args.worker_dir, worker_index=args.worker_index,
                               worker_count=args.worker_count)
        finally:
            reset_tracing()  # exports the spans not sent yet

    return run(_main)


if __name__ == "__main__":
    sys.exit(main())
