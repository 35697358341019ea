"""motor register: register native engines (vLLM, SGLang) with a standalone coordinator.

  motor register add  --role prefill --model M --engine vllm --endpoint 10.0.0.1:8100,kv=5600
  motor register set  --file instances.yaml          # replaces the whole instance set
  motor register del  --id 7209446036682503          # or --endpoint 10.0.0.1:8100
  motor register list [--json]

Every command talks to the coordinator given by --coordinator (env MOTOR_COORDINATOR; default:
the fleet motor up runs in --state-dir, else 127.0.0.1:9100) with the management key from
--management-key-file (env MOTOR_MANAGEMENT_KEY_FILE; default: that fleet's key). Before add/set
the engines are health-checked (GET /v1/models must list a model; --no-health-check skips) and
the coordinator's instances are listed, so conflicts are refused before anything is submitted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import grpc

from motor_cli import arg_types, health, output, target
from motor_cli.registration import (
    EndpointSpec,
    build_instance,
    describe,
    parse_endpoint,
    plan_add,
    plan_set,
    resolve_delete,
)
from motor_cli.tls_args import add_tls_flags, tls_from_args
from motor_common.config import load_config
from motor_common.convert import instance_from_pb, instance_to_pb
from motor_common.domain import EngineType, Instance, InstanceStatus, Role
from motor_common.errors import InvalidArgument, MotorError
from motor_common.gen.motor.common.v1 import types_pb2 as pb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_client import call_metadata, open_channel, translate
from motor_common.grpc_server import error_reason, read_secret

DEFAULT_COORDINATOR = "127.0.0.1:9100"
EXIT_FAILED = 1
ATTEMPTS = 3  # list-then-write tries when another writer changes the set in between


@dataclass(frozen=True)
class InstanceEntry:
    """One instance in a registration file (unknown keys are rejected)."""

    role: Literal["prefill", "decode", "union"]
    model: str
    engine: Literal["vllm", "sglang"]
    endpoints: list[str]
    job: str | None = None


@dataclass(frozen=True)
class RegistrationFile:
    instances: list[InstanceEntry]


# -- argument parsing ------------------------------------------------------------------------------


def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--coordinator", metavar="ADDR",
                   help="coordinator gRPC address (env MOTOR_COORDINATOR; default: the fleet in --state-dir, "
                   f"else {DEFAULT_COORDINATOR})")
    p.add_argument("--management-key-file", metavar="FILE",
                   help="file holding the management key (env MOTOR_MANAGEMENT_KEY_FILE; default: the fleet's)")
    p.add_argument("--state-dir", default=target.DEFAULT_STATE_DIR,
                   help="a fleet started by `motor up` (default %(default)s)")
    add_tls_flags(p)
    p.add_argument("--timeout", type=arg_types.seconds(), default=10.0, help="seconds per call (default %(default)s)")
    p.add_argument("--json", action="store_true", help="machine-readable JSON output")
    return p


def _instance_flags(p: argparse.ArgumentParser, *, file_help: str) -> None:
    p.add_argument("--role", choices=[r.value for r in Role])
    p.add_argument("--model", help="served model name, as clients send it in 'model'")
    p.add_argument("--engine", choices=[e.value for e in EngineType])
    p.add_argument("--endpoint", action="append", default=[], metavar="IP:PORT[,bootstrap=N][,kv=N][,kv_events=N][,kv_events_replay=N]",
                   help="one engine of the instance (repeatable: all endpoints of one instance)")
    p.add_argument("--job", help="job name (default derived from role and instance id)")
    p.add_argument("--file", help=file_help)
    p.add_argument("--no-health-check", action="store_true",
                   help="skip the GET /v1/models probe of each engine")


def configure(p: argparse.ArgumentParser) -> None:
    """Add the register sub-commands to *p* (used by ``motor register`` and ``python -m``)."""
    common = _common()
    sub = p.add_subparsers(dest="action", required=True, metavar="{set,add,del,list}")
    raw = argparse.RawDescriptionHelpFormatter
    add = sub.add_parser("add", parents=[common], help="add one instance (or those of --file)", formatter_class=raw,
                         description="Add one instance (all its engines) or those of --file; an identical "
                         "re-add is a no-op.\n\n"
                         "  motor register add --role prefill --model M --engine vllm --endpoint 10.0.0.1:8100,kv=5600\n"
                         "  motor register add --role decode --model M --engine vllm --endpoint 10.0.0.2:8200 "
                         "--endpoint 10.0.0.2:8201\n"
                         "  motor register add --file instances.yaml")
    _instance_flags(add, file_help="YAML/JSON file with an 'instances' list to add")
    set_ = sub.add_parser("set", parents=[common], help="replace the whole instance set", formatter_class=raw,
                          description="Replace the coordinator's whole instance set with --file (or one instance "
                          "from the flags).\n\n  motor register set --file instances.yaml")
    _instance_flags(set_, file_help="YAML/JSON file with an 'instances' list (the complete set)")
    set_.add_argument("--force", action="store_true",
                      help="also drop instances the controller manages (ids without the standalone bit)")
    del_ = sub.add_parser("del", parents=[common], help="delete instances by id or endpoint", formatter_class=raw,
                          description="Delete instances, named by id or by one of their endpoints.\n\n"
                          "  motor register del --id 7209446036682503\n  motor register del --endpoint 10.0.0.1:8100")
    del_.add_argument("--id", type=int, action="append", default=[], help="instance id (repeatable)")
    del_.add_argument("--endpoint", action="append", default=[], metavar="IP:PORT",
                      help="delete the instance serving this endpoint (repeatable)")
    sub.add_parser("list", parents=[common], help="list registered instances", formatter_class=raw,
                   description="List the registered instances with their status and a summary.\n\n"
                   "  motor register list\n  motor register list --json | jq '.instances[].id'")


# -- building instances ----------------------------------------------------------------------------


def instances_from_args(args: argparse.Namespace) -> list[Instance]:
    if args.file:
        if args.role or args.model or args.engine or args.endpoint or args.job:
            raise InvalidArgument("--file cannot be combined with --role/--model/--engine/--endpoint/--job")
        spec = load_config(RegistrationFile, args.file)
        return [
            build_instance(Role(e.role), e.model, EngineType(e.engine), [parse_endpoint(x) for x in e.endpoints],
                           e.job)
            for e in spec.instances
        ]
    missing = [flag for flag, value in (("--role", args.role), ("--model", args.model),
                                        ("--engine", args.engine), ("--endpoint", args.endpoint)) if not value]
    if missing:
        raise InvalidArgument(f"missing {', '.join(missing)} (or give --file)")
    endpoints = [parse_endpoint(text) for text in args.endpoint]
    return [build_instance(Role(args.role), args.model, EngineType(args.engine), endpoints, args.job)]


async def check_health(instances: Sequence[Instance], timeout: float) -> list[str]:
    """Problems found by probing every engine (empty = all healthy); model mismatches are warnings."""
    endpoints = [ep for inst in instances for ep in inst.endpoints]
    models = {ep.host_port: inst.model_name for inst in instances for ep in inst.endpoints}
    problems = []
    for result in await health.probe_all(endpoints, timeout):
        if not result.healthy:
            problems.append(f"endpoint {result.endpoint} is unhealthy: {result.detail}")
        elif models[result.endpoint] not in result.models:
            print(f"warning: endpoint {result.endpoint} serves {list(result.models)}, "
                  f"not {models[result.endpoint]!r}", file=sys.stderr)
    return problems


# -- talking to the coordinator --------------------------------------------------------------------


class Registry:
    def __init__(self, args: argparse.Namespace) -> None:
        self.address = target.coordinator_address(args.coordinator, args.state_dir, DEFAULT_COORDINATOR)
        self.timeout = args.timeout
        self.metadata = call_metadata(read_secret(target.management_key_file(args.management_key_file,
                                                                            args.state_dir)))
        self.channel = open_channel(self.address, tls=tls_from_args(args, {"tls": target.tls_section(args.state_dir)}))
        self.stub = cgrpc.InstanceRegistryServiceStub(self.channel)

    async def list(self) -> tuple[list[Instance], cpb.ListInstancesResponse]:
        """Every instance, from pages that all saw the same generation (re-listed when the set
        changed between two pages), and the last page (its ``generation`` is the listed one)."""
        for _ in range(ATTEMPTS):
            out: list[Instance] = []
            token = ""
            first: int | None = None
            while True:
                resp = await self.stub.ListInstances(
                    cpb.ListInstancesRequest(page_token=token), timeout=self.timeout, metadata=self.metadata)
                first = resp.generation if first is None else first
                if resp.generation != first:
                    break  # the set changed under the listing: start again
                for msg in resp.instances:
                    inst = instance_from_pb(msg)
                    if msg.status == pb.INSTANCE_STATUS_UNAVAILABLE:  # convert folds it into AVAILABLE
                        inst = replace(inst, status=InstanceStatus.UNAVAILABLE)
                    out.append(inst)
                token = resp.next_page_token
                if not token:
                    return out, resp
        raise MotorError(f"the instance set on {self.address} kept changing while it was listed; try again")

    async def close(self) -> None:
        await self.channel.close()


def _emit(args: argparse.Namespace, doc: dict[str, Any], text: str) -> None:
    print(output.dumps(doc) if args.json else text)


async def _retrying(write: Callable[[], Awaitable[int]], reg: Registry) -> int:
    """Run a list-then-write step again when another writer changed the set in between (the write
    carries the listed generation as ``if_generation``: GENERATION_CHANGED, nothing applied)."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return await write()
        except grpc.aio.AioRpcError as exc:
            if error_reason(exc) != "GENERATION_CHANGED" or attempt == ATTEMPTS:
                raise
            print(f"note: the instance set on {reg.address} changed while this command ran; "
                  "listing it again", file=sys.stderr)
    raise AssertionError("unreachable")


async def _add_or_set(args: argparse.Namespace, reg: Registry) -> int:
    instances = instances_from_args(args)
    if not args.no_health_check:
        problems = await check_health(instances, min(args.timeout, 5.0))
        if problems:
            for line in problems:
                print(f"error: {line}", file=sys.stderr)
            print("error: nothing registered (use --no-health-check to skip the probe)", file=sys.stderr)
            return EXIT_FAILED
    return await _retrying(lambda: _write_add_or_set(args, reg, instances), reg)


async def _write_add_or_set(args: argparse.Namespace, reg: Registry, instances: list[Instance]) -> int:
    existing, listed = await reg.list()
    pbs = [instance_to_pb(i) for i in instances]
    if args.action == "add":
        submit, present = plan_add(instances, existing)
        generation = 0
        if submit:
            resp = await reg.stub.AddInstances(
                cpb.AddInstancesRequest(instances=[instance_to_pb(i) for i in submit],
                                        if_generation=listed.generation),
                timeout=args.timeout, metadata=reg.metadata)
            generation = resp.generation
        lines = [output.table(instances)]
        lines += [f"already registered: {describe(i)}" for i in present]
        lines.append(f"added {len(submit)} instance(s)" + (f", generation {generation}" if submit else ""))
        _emit(args, {"added": [output.instance_dict(i) for i in submit],
                     "already_registered": [output.instance_dict(i) for i in present],
                     "generation": generation}, "\n".join(lines))
        return 0
    dropped = plan_set(instances, existing, force=args.force)
    set_resp = await reg.stub.SetInstances(cpb.SetInstancesRequest(instances=pbs, if_generation=listed.generation),
                                           timeout=args.timeout, metadata=reg.metadata)
    text = output.table(instances) + (
        f"\nset {set_resp.instance_count} instance(s), dropped {len(dropped)}, generation {set_resp.generation}")
    _emit(args, {"instances": [output.instance_dict(i) for i in instances],
                 "dropped": [output.instance_dict(i) for i in dropped],
                 "generation": set_resp.generation}, text)
    return 0


async def _delete(args: argparse.Namespace, reg: Registry) -> int:
    return await _retrying(lambda: _write_delete(args, reg), reg)


async def _write_delete(args: argparse.Namespace, reg: Registry) -> int:
    specs: list[EndpointSpec] = [parse_endpoint(text) for text in args.endpoint]
    existing, listed = await reg.list()
    targets = resolve_delete(existing, ids=args.id, endpoints=specs)
    resp = await reg.stub.DeleteInstances(
        cpb.DeleteInstancesRequest(instances=[instance_to_pb(i) for i in targets], if_generation=listed.generation),
        timeout=args.timeout, metadata=reg.metadata)
    text = output.table(targets) + f"\ndeleted {len(resp.deleted_ids)} instance(s), generation {resp.generation}"
    _emit(args, {"deleted": [output.instance_dict(i) for i in targets], "deleted_ids": list(resp.deleted_ids),
                 "generation": resp.generation}, text)
    return 0


async def _list(args: argparse.Namespace, reg: Registry) -> int:
    instances, resp = await reg.list()
    s = resp.summary
    summary = {"available": s.available, "unavailable": s.unavailable, "paused": s.paused,
               "prefill": s.prefill, "decode": s.decode, "union": s.union_instances}
    text = output.table(instances) + "\n" + ", ".join(f"{k} {v}" for k, v in summary.items()) + (
        f", generation {resp.generation}")
    _emit(args, {"instances": [output.instance_dict(i) for i in instances], "summary": summary,
                 "generation": resp.generation}, text)
    return 0


_ACTIONS = {"add": _add_or_set, "set": _add_or_set, "del": _delete, "list": _list}


async def _run(args: argparse.Namespace) -> int:
    reg = Registry(args)
    try:
        return await _ACTIONS[args.action](args, reg)
    except grpc.aio.AioRpcError as exc:
        err = translate(exc)
        code = exc.code().name
        hint = f" (is motor-coordinator listening on {reg.address}?)" if code == "UNAVAILABLE" else ""
        print(f"error: {code}: {err.message}{hint}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        await reg.close()


def run(args: argparse.Namespace) -> int:
    """Entry point used by ``motor register`` (see ``motor_cli.main``)."""
    try:
        return asyncio.run(_run(args))
    except MotorError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m motor_cli.register", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
