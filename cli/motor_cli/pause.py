"""motor pause / motor resume: take an instance of a managed fleet out of scheduling, or put it back.

    motor pause 3524124913735523 --reason "bad GPU, draining"   # the fleet `motor up` runs in ./.motor/up
    motor pause --node decode-0 --reason "bad GPU"                # the instance that node serves
    motor resume 3524124913735523 --controller 10.0.0.5:9200 --management-key-file key

Calls the controller's ControllerAdminService/PauseInstance (ResumeInstance). The controller keeps
the pause in its store (it survives a restart or failover of the controller) and pushes the instance
to every coordinator as PAUSED: requests in flight finish, new ones go to other instances. A pause
of an instance that is not ACTIVE yet takes effect when it becomes ACTIVE.

A node paused by its own nodemanager (NodeManagerService/PauseNode, e.g. a Kubernetes pre-stop
drain) keeps its instance PAUSED after `motor resume`; the command names such nodes.

Standalone coordinators (no controller) use `grpcurl … InstanceRegistryService/PauseInstances`; a
coordinator managed by a controller refuses that call (FAILED_PRECONDITION MANAGED_BY_CONTROLLER).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import grpc

from motor_cli import arg_types, target
from motor_cli.tls_args import add_tls_flags, tls_from_args
from motor_common.errors import MotorError
from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbg
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.grpc_server import read_secret
from motor_common.tls import TlsConfig

EXIT_FAILED = 1
MAX_ID = 2**53 - 1
MAX_REASON_BYTES = 256


def _instance_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an instance id (a decimal number)") from None
    if not 1 <= value <= MAX_ID:
        raise argparse.ArgumentTypeError(f"instance id {value} is outside [1, 2^53-1]")
    return value


def _reason(text: str) -> str:
    if len(text.encode()) > MAX_REASON_BYTES:
        raise argparse.ArgumentTypeError(f"--reason is {len(text.encode())} bytes; at most {MAX_REASON_BYTES}")
    return text


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("instance_id", type=_instance_id, nargs="?", help="instance id (see motor status)")
    parser.add_argument("--node", metavar="NODE_ID", default="",
                        help="instead of an instance id: a node id; its whole instance is paused (resumed)")
    if parser.prog.endswith("pause"):
        parser.add_argument("--reason", type=_reason, default="",
                            help="why (shown by motor status while paused; at most 256 bytes)")
    parser.add_argument("--state-dir", default=target.DEFAULT_STATE_DIR,
                        help="fleet started by `motor up` (default %(default)s)")
    parser.add_argument("--controller", metavar="ADDR",
                        help="controller address (env MOTOR_CONTROLLER; default: the fleet in --state-dir)")
    parser.add_argument("--management-key-file", metavar="FILE",
                        help="management key (env MOTOR_MANAGEMENT_KEY_FILE; default: the fleet's)")
    parser.add_argument("--timeout", type=arg_types.seconds(), default=5.0, help="seconds per call (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_tls_flags(parser)


async def change(address: str, key: str | None, instance_id: int, pause: bool, timeout: float,
                 tls: TlsConfig | None = None, reason: str = "", node_id: str = "",
                 ) -> tuple[pb.ManagedInstance, list[str]]:
    """Pauses (resumes) *instance_id* at the controller; returns the instance after the call and,
    for a resume, the nodes whose nodemanager still holds a pause of its own."""
    md = call_metadata(key)
    async with open_channel(address, tls=tls) as channel:
        stub = pbg.ControllerAdminServiceStub(channel)
        if pause:
            paused = await stub.PauseInstance(pb.PauseInstanceRequest(instance_id=instance_id, reason=reason,
                                                                      node_id=node_id),
                                              metadata=md, timeout=timeout)
            return paused.instance, []
        resumed = await stub.ResumeInstance(pb.ResumeInstanceRequest(instance_id=instance_id, node_id=node_id),
                                            metadata=md, timeout=timeout)
        return resumed.instance, list(resumed.paused_node_ids)


def run(args: argparse.Namespace) -> int:
    pause = args.command == "pause"
    if (args.instance_id is None) == (not args.node):
        print("error: give an instance id or --node NODE_ID (one of them)", file=sys.stderr)
        return 2
    try:
        address = target.controller_address(args.controller, args.state_dir)
        key_file = target.management_key_file(args.management_key_file, args.state_dir)
        key = read_secret(key_file) if key_file else None
        tls = tls_from_args(args, {"tls": target.tls_section(args.state_dir)})
        inst, held = asyncio.run(change(address, key, args.instance_id or 0, pause, args.timeout, tls,
                                        getattr(args, "reason", ""), args.node))
    except MotorError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    except grpc.aio.AioRpcError as exc:
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return EXIT_FAILED
    state = pb.InstanceState.Name(inst.state).removeprefix("INSTANCE_STATE_").lower()
    args.instance_id = inst.instance.id
    if args.json:
        print(json.dumps({"instance_id": args.instance_id, "state": "paused" if pause else "resumed",
                          "paused": inst.paused, "reason": inst.pause_reason,
                          "instance_state": state, "paused_by_nodes": held}))
        return 0
    if pause:
        when = "" if state == "active" else f" (it is {state}: the pause applies once it is active)"
        print(f"instance {args.instance_id} paused: {inst.pause_reason}{when}; the controller pushes it to the "
              f"coordinators as PAUSED")
    else:
        print(f"instance {args.instance_id} resumed; the controller pushes it to the coordinators as AVAILABLE")
        if held:
            print(f"warning: node(s) {', '.join(held)} are paused by their nodemanager (PauseNode); the instance "
                  f"stays PAUSED until each is resumed (NodeManagerService/ResumeNode)", file=sys.stderr)
    return 0
