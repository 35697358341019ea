"""``python -m motor_nodemanager.prestop [--config FILE] [--drain-sec S]``: a pod's PreStop hook.

Calls this node's own ``PauseNode`` (at its advertised ``ip`` — the pod IP — on ``server.port``,
with an operator key — ``--key-file``, else the config's ``server.management_key_file`` — and, when the nodemanager serves TLS, its own ``server.tls`` identity: its CA
verifies the server, its certificate is the client certificate for mutual TLS; all read from the
nodemanager's config the way the nodemanager reads it), so its endpoints are reported paused
and the coordinator stops sending them requests, then waits ``--drain-sec`` for in-flight requests
to finish before the kubelet sends SIGTERM (which stops the engines). Exit 0 when paused, 1 when the
pause failed (the kubelet records a FailedPreStopHook event and goes on with SIGTERM), 2 on a bad
config.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import grpc

from motor_common.errors import ConfigError
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as pb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2_grpc as pbgrpc
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.grpc_server import read_secret
from motor_common.ports import host_port
from motor_common.tls import TlsConfig
from motor_nodemanager import config as nmconfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m motor_nodemanager.prestop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="the nodemanager's config file (USER_CONFIG_PATH, then CONFIG_PATH "
                   "take precedence, as for motor-nodemanager)")
    p.add_argument("--drain-sec", type=float, default=30.0,
                   help="seconds to wait after the pause for in-flight requests (default 30)")
    p.add_argument("--timeout", type=float, default=5.0, help="timeout of the PauseNode call (default 5)")
    p.add_argument("--key-file", help="an operator key the nodemanager accepts (one of its "
                   "server.auth.operator_keys_file, e.g. a 'prestop' entry); default: its server.management_key_file")
    p.add_argument("--tls-ca-file", help="CA bundle verifying the nodemanager's certificate when its "
                   "config has no server.tls.ca_file")
    args = p.parse_args(argv)
    if not 0 <= args.drain_sec <= 3600 or not 0 < args.timeout <= 60:
        p.error("--drain-sec must be in [0, 3600] and --timeout in (0, 60]")
    return args


async def pause(address: str, key: str | None, timeout: float, tls: TlsConfig | None, tls_ca_file: str | None) -> None:
    async with open_channel(address, tls=tls, tls_ca_file=tls_ca_file) as ch:
        await pbgrpc.NodeManagerServiceStub(ch).PauseNode(
            pb.PauseNodeRequest(), metadata=call_metadata(key), timeout=timeout
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = nmconfig.load(nmconfig.config_path(args.config, os.environ))
        key = read_secret(args.key_file or cfg.server.management_key_file, "operator key")
    except ConfigError as exc:
        print(f"prestop: {exc}", file=sys.stderr)
        return 2
    if key is None and cfg.server.auth.operator_keys_file:
        print("prestop: the nodemanager's PauseNode needs an operator key (server.auth.operator_keys_file) and "
              "the config has no server.management_key_file: pass --key-file with one of its operator keys",
              file=sys.stderr)
        return 2
    # the advertised address: the server listens there (a loopback bind forces a loopback ip) and
    # the node's certificate names it, as the controller dials it too
    address = host_port(cfg.ip, cfg.server.port)
    tls = cfg.server.tls if cfg.server.tls.serves_tls else None
    if tls is not None and not (tls.ca_file or args.tls_ca_file):
        print("prestop: the nodemanager serves TLS: set server.tls.ca_file or pass --tls-ca-file", file=sys.stderr)
        return 2
    try:
        asyncio.run(pause(address, key, args.timeout, tls, args.tls_ca_file if tls else None))
    except grpc.aio.AioRpcError as exc:
        print(f"prestop: PauseNode on {address} failed: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    print(f"prestop: node paused; draining for {args.drain_sec:g}s", file=sys.stderr, flush=True)

    async def drain() -> None:  # a grace period for in-flight requests, not synchronisation
        await asyncio.sleep(args.drain_sec)

    asyncio.run(drain())
    return 0


if __name__ == "__main__":
    sys.exit(main())
