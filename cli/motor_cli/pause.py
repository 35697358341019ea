"""motor pause / motor resume: take an instance of a managed fleet out of scheduling, or put it back.

    motor pause 3524124913735523        # the fleet `motor up` runs in ./.motor/up
    motor resume 3524124913735523 --controller 10.0.0.5:9200 --management-key-file key

Asks the controller which nodes run the instance, then pauses (resumes) each of them through its
nodemanager (NodeManagerService/PauseNode): the node's endpoints turn PAUSED, which the nodemanager
never overwrites by polling, and the controller pushes the instance to the coordinators as PAUSED
at every push until it is resumed. In-flight requests finish; new ones go elsewhere. A pause held
by a nodemanager ends if that nodemanager restarts.

Standalone coordinators (no controller) use `grpcurl … InstanceRegistryService/PauseInstances`; a
coordinator managed by a controller refuses that call (FAILED_PRECONDITION MANAGED_BY_CONTROLLER).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import grpc

from motor_cli import target
from motor_cli.tls_args import add_tls_flags, tls_from_args
from motor_common.errors import MotorError
from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbg
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as npb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2_grpc as npbg
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.grpc_server import read_secret
from motor_common.ports import host_port
from motor_common.tls import TlsConfig

EXIT_FAILED = 1
MAX_ID = 2**53 - 1


def _instance_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an instance id (a decimal number)") from None
    if not 1 <= value <= MAX_ID:
        raise argparse.ArgumentTypeError(f"instance id {value} is outside [1, 2^53-1]")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("instance_id", type=_instance_id, help="instance id (see motor status)")
    parser.add_argument("--state-dir", default=target.DEFAULT_STATE_DIR,
                        help="fleet started by `motor up` (default %(default)s)")
    parser.add_argument("--controller", metavar="ADDR",
                        help="controller address (env MOTOR_CONTROLLER; default: the fleet in --state-dir)")
    parser.add_argument("--management-key-file", metavar="FILE",
                        help="management key (env MOTOR_MANAGEMENT_KEY_FILE; default: the fleet's)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per call (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_tls_flags(parser)


async def change(address: str, key: str | None, instance_id: int, pause: bool, timeout: float,
                 tls: TlsConfig | None = None) -> list[str]:
    """Pauses (resumes) every node of *instance_id*; returns their node ids."""
    md = call_metadata(key)
    async with open_channel(address, tls=tls) as channel:
        stub = pbg.ControllerAdminServiceStub(channel)
        inst = (await stub.GetInstance(pb.GetInstanceRequest(instance_id=instance_id), metadata=md,
                                       timeout=timeout)).instance
        nodes: list[pb.Node] = []
        token = ""
        while True:
            page = await stub.ListNodes(pb.ListNodesRequest(job_name=inst.instance.job_name, page_token=token),
                                        metadata=md, timeout=timeout)
            nodes.extend(n for n in page.nodes if n.spec.node_id in set(inst.node_ids))
            token = page.next_page_token
            if not token:
                break
    if not nodes:
        raise RuntimeError(f"the controller knows no node of instance {instance_id}")
    for node in nodes:
        async with open_channel(host_port(node.spec.ip, node.spec.admin_port), tls=tls) as channel:
            nm = npbg.NodeManagerServiceStub(channel)
            if pause:
                await nm.PauseNode(npb.PauseNodeRequest(), metadata=md, timeout=timeout)
            else:
                await nm.ResumeNode(npb.ResumeNodeRequest(), metadata=md, timeout=timeout)
    return [n.spec.node_id for n in nodes]


def run(args: argparse.Namespace) -> int:
    pause = args.command == "pause"
    try:
        address = target.controller_address(args.controller, args.state_dir)
        key_file = target.management_key_file(args.management_key_file, args.state_dir)
        key = read_secret(key_file) if key_file else None
        tls = tls_from_args(args, {"tls": target.tls_section(args.state_dir)})
        node_ids = asyncio.run(change(address, key, args.instance_id, pause, args.timeout, tls))
    except MotorError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    except grpc.aio.AioRpcError as exc:
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return EXIT_FAILED
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    verb = "paused" if pause else "resumed"
    if args.json:
        print(json.dumps({"instance_id": args.instance_id, "state": verb, "nodes": node_ids}))
    else:
        print(f"instance {args.instance_id} {verb} on node(s) {', '.join(node_ids)}; the controller "
              f"pushes it to the coordinators at its next push")
    return 0
