"""``motor-coordinator --config FILE [--host H] [--port P] [--http-port P] [--ports-file PATH] [--log-format F]``."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from motor_common.config import load_config, to_dict
from motor_common.logs import setup_logging
from motor_common.runner import (
    DOCS_HINT,
    EXIT_RESCHEDULE,
    check_config,
    run,
    stop_event_on_signals,
    write_ports_file,
)
from motor_common.tracing import reset_tracing, setup_tracing
from motor_common.version import add_version_flag
from motor_coordinator.app import Coordinator
from motor_coordinator.config import ENV_PREFIX, CoordinatorConfig
from motor_coordinator.election import EtcdLeadership
from motor_coordinator.hf_tokenizer_loader import load_hf_tokenizers

log = logging.getLogger("motor_coordinator")


HELP = """Motor coordinator: the PD dispatcher. Holds the instance registry (fed by the controller, or
by `motor register` when standalone), picks a prefill and a decode engine per request and drives
the engines' native PD protocol; optionally serves the OpenAI routes itself (--http-port).

  motor-coordinator --config coordinator.yaml
  motor-coordinator --port 9100 --http-port 8000      # standalone, co-located OpenAI front
  motor-coordinator --config coordinator.yaml --check-config
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="motor-coordinator", description=HELP,
                                epilog="Config keys: docs/coordinator.md; standalone use: docs/standalone.md. "
                                + DOCS_HINT, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version_flag(p)
    p.add_argument("--config", help="YAML or JSON config file (unknown keys are rejected)")
    p.add_argument("--host", help="gRPC listen address (overrides server.host)")
    p.add_argument("--port", type=int, help="gRPC port, 0 = any (overrides server.port)")
    p.add_argument("--ports-file", help='write {"grpc": port, "metrics": port|null, "http": port|null} here once listening')
    p.add_argument("--http-port", type=int, help="serve the OpenAI routes here too (co-located front, "
                   "in process; 0 = any; overrides http.port)")
    p.add_argument("--http-host", help="co-located front listen address (overrides http.host)")
    p.add_argument("--log-format", choices=("json", "text"), help="overrides log.format")
    p.add_argument("--check-config", action="store_true",
                   help="validate the configuration and exit (0 valid, 2 invalid); starts nothing")
    return p.parse_args(argv)



def load(args: argparse.Namespace) -> CoordinatorConfig:
    overrides: dict[str, Any] = {}
    server: dict[str, Any] = {}
    if args.host is not None:
        server["host"] = args.host
    if args.port is not None:
        server["port"] = args.port
    if server:
        overrides["server"] = server
    http: dict[str, Any] = {}
    if args.http_port is not None:
        http["port"] = args.http_port
    if args.http_host is not None:
        http["host"] = args.http_host
    if http:
        overrides["http"] = http
    if args.log_format is not None:
        overrides["log"] = {"format": args.log_format}
    return load_config(CoordinatorConfig, args.config, env_prefix=ENV_PREFIX, overrides=overrides)


async def amain(args: argparse.Namespace) -> int:
    cfg = load(args)
    setup_logging("coordinator", cfg.log.level, cfg.log.format)
    setup_tracing(cfg.tracing, "coordinator")
    try:
        return await _serve(args, cfg)
    finally:
        reset_tracing()  # exports the spans not sent yet


async def _serve(args: argparse.Namespace, cfg: CoordinatorConfig) -> int:
    stop = stop_event_on_signals()
    app = Coordinator(cfg)
    port = await app.start()
    log.info("coordinator started", extra={"grpc_port": port, "config": to_dict(cfg)})
    code = 0
    try:
        if args.ports_file:
            write_ports_file(args.ports_file, {"grpc": port, "metrics": app.ops.port if app.ops else None,
                                               "http": app.http_port})
        lead = app.leadership
        if isinstance(lead, EtcdLeadership) and cfg.ha.exit_on_lost:
            # Kubernetes mode: a master that lost the lock exits non-zero so its pod leaves the Service.
            await _first(stop.wait(), lead.lost.wait())
            if lead.lost.is_set() and not stop.is_set():
                log.error("lost the master lock: exiting (ha.exit_on_lost)", extra={"exit_code": EXIT_RESCHEDULE})
                code = EXIT_RESCHEDULE
        else:
            await stop.wait()
        log.info("stopping")
    finally:
        await app.stop()
    return code


async def _first(*aws: Coroutine[Any, Any, Any]) -> None:
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


def load_checked(args: argparse.Namespace) -> CoordinatorConfig:
    """--check-config: the configuration, and the files it names that start-up reads (the
    kv_events Hugging Face tokenizer: the extra installed, the files readable)."""
    cfg = load(args)
    kv = cfg.scheduler.kv_events
    if kv.tokenizer == "hf":
        load_hf_tokenizers(kv.tokenizer_path, kv.tokenizer_paths)
    return cfg


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.check_config:
        return check_config(lambda: load_checked(args))
    return run(lambda: amain(args))


if __name__ == "__main__":
    raise SystemExit(main())
