"""Engine command lines: argv + environment for one native engine process per endpoint. Pure.

Launchers own every engine-specific byte:

- ``vllm``: ``vllm serve MODEL --host --port --served-model-name M [--kv-transfer-config {...}]
  [--data-parallel-size/-rank/-address/-rpc-port] [--tensor-parallel-size]``; env
  ``VLLM_NIXL_SIDE_CHANNEL_PORT`` (endpoint kv_port minus the dp rank, because vLLM listens on
  base + dp rank), ``VLLM_NIXL_SIDE_CHANNEL_HOST``,
  ``VLLM_HOST_IP`` (defaults to ``POD_IP``, else the node ip).
- ``sglang``: ``python -m sglang.launch_server --model-path P --served-model-name M --host --port
  [--disaggregation-mode prefill|decode --disaggregation-bootstrap-port] [--dp-size]
  [--tp-size] [--dist-init-addr --nnodes --node-rank]``.
- ``simulator``: ``motor-sim vllm serve ...`` / ``motor-sim sglang ...`` with exactly the flags above.
- KV-cache events (``engine.kv_events.enable``): ``--kv-events-config`` in the engine's own keys
  (:func:`kv_events_config`), publisher and replay sockets bound on the endpoint's planned ports.

Every process also gets the accelerator visibility variable (``local_world_size`` devices per
process, wrapping cyclically over ``device_count``) and ``MOTOR_*`` identity variables.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from motor_common.domain import Endpoint, EngineType, Role
from motor_nodemanager.start_command import StartCommand

KV_ROLE = {Role.PREFILL: "kv_producer", Role.DECODE: "kv_consumer"}
SGLANG_MODE = {Role.PREFILL: "prefill", Role.DECODE: "decode"}


@dataclass(frozen=True)
class LaunchSettings:
    """What the node's configuration contributes to a command line."""

    launcher: str  # simulator | vllm | sglang
    model_path: str
    local_world_size: int = 1
    device_count: int = 8
    visible_devices_env: str = "CUDA_VISIBLE_DEVICES"
    command: tuple[str, ...] | None = None
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    kv_connector: str = "NixlConnector"
    zmq_pub_port: int | None = None
    simulator_bin: str = "motor-sim"
    # ZMQ topic of the engines' KV-cache events; None = no --kv-events-config.
    kv_events_topic: str | None = None


@dataclass(frozen=True)
class LaunchPlan:
    endpoint: Endpoint
    local_index: int
    argv: tuple[str, ...]
    env: Mapping[str, str]


def visible_devices(local_index: int, local_world_size: int, device_count: int) -> str:
    """Devices of the engine at *local_index*: a contiguous window, wrapping over device_count."""
    start = local_index * local_world_size
    return ",".join(str((start + k) % device_count) for k in range(local_world_size))


def command_prefix(settings: LaunchSettings, engine_type: EngineType) -> tuple[str, ...]:
    if settings.command:
        return settings.command
    if settings.launcher == "simulator":
        sim = settings.simulator_bin
        return (sim, "vllm", "serve") if engine_type is EngineType.VLLM else (sim, "sglang")
    if settings.launcher == "vllm":
        return ("vllm", "serve")
    if settings.launcher == "sglang":
        return (sys.executable, "-m", "sglang.launch_server")
    raise ValueError(f"unknown launcher {settings.launcher!r}")


def kv_events_config(engine_type: EngineType, ep: Endpoint, topic: str, dp_offset: int = 0) -> dict[str, object]:
    """The engine's ``--kv-events-config`` for *ep*'s planned ports. A ``*`` host binds (an explicit
    host would make vLLM *connect*); vLLM adds the data-parallel rank to both ports
    (``offset_endpoint_port``), so *dp_offset* is taken off to land on the planned ones."""
    cfg: dict[str, object] = {}
    if engine_type is EngineType.VLLM:
        cfg["enable_kv_cache_events"] = True
    cfg["publisher"] = "zmq"
    cfg["endpoint"] = f"tcp://*:{ep.kv_events_port - dp_offset}"
    if ep.kv_events_replay_port:
        cfg["replay_endpoint"] = f"tcp://*:{ep.kv_events_replay_port - dp_offset}"
    cfg["topic"] = topic
    return cfg


def _kv_events_args(cmd: StartCommand, ep: Endpoint, s: LaunchSettings) -> list[str]:
    if s.kv_events_topic is None or not ep.kv_events_port:
        return []
    offset = ep.dp_rank if cmd.engine_type is EngineType.VLLM and cmd.dp_size > 1 else 0
    cfg = kv_events_config(cmd.engine_type, ep, s.kv_events_topic, offset)
    return ["--kv-events-config", json.dumps(cfg, separators=(",", ":"))]


def _vllm_args(cmd: StartCommand, ep: Endpoint, s: LaunchSettings) -> list[str]:
    args = [s.model_path, "--host", ep.ip, "--port", str(ep.business_port), "--served-model-name", cmd.model_name]
    kv_role = KV_ROLE.get(cmd.role)
    if kv_role is not None:
        kv = {"kv_connector": s.kv_connector, "kv_role": kv_role}
        args += ["--kv-transfer-config", json.dumps(kv, separators=(",", ":"))]
    if cmd.dp_size > 1:
        args += ["--data-parallel-size", str(cmd.dp_size), "--data-parallel-rank", str(ep.dp_rank)]
        if cmd.master_address:
            args += ["--data-parallel-address", cmd.master_address]
        if cmd.master_port:
            args += ["--data-parallel-rpc-port", str(cmd.master_port)]
    if s.local_world_size > 1:
        args += ["--tensor-parallel-size", str(s.local_world_size)]
    return args


def _sglang_args(cmd: StartCommand, ep: Endpoint, s: LaunchSettings) -> list[str]:
    args = [
        "--model-path", s.model_path,
        "--served-model-name", cmd.model_name,
        "--host", ep.ip,
        "--port", str(ep.business_port),
    ]  # fmt: skip
    mode = SGLANG_MODE.get(cmd.role)
    if mode is not None:
        args += ["--disaggregation-mode", mode]
        if cmd.role is Role.PREFILL and ep.bootstrap_port:
            args += ["--disaggregation-bootstrap-port", str(ep.bootstrap_port)]
    if cmd.dp_size > 1:
        args += ["--dp-size", str(cmd.dp_size)]
    if s.local_world_size > 1:
        args += ["--tp-size", str(s.local_world_size)]
    if cmd.num_nodes > 1 and cmd.master_address:
        addr = f"[{cmd.master_address}]" if ":" in cmd.master_address else cmd.master_address
        args += ["--dist-init-addr", f"{addr}:{cmd.master_port}", "--nnodes", str(cmd.num_nodes)]
        args += ["--node-rank", str(cmd.node_rank)]
    return args


def engine_env(
    cmd: StartCommand, ep: Endpoint, local_index: int, s: LaunchSettings, base_env: Mapping[str, str]
) -> dict[str, str]:
    env = dict(base_env)
    env.update(dict(s.env))
    env[s.visible_devices_env] = visible_devices(local_index, s.local_world_size, s.device_count)
    env["MOTOR_INSTANCE_ID"] = str(cmd.instance_id)
    env["MOTOR_ENDPOINT_ID"] = str(ep.id)
    env["MOTOR_DP_RANK"] = str(ep.dp_rank)
    env["MOTOR_NODE_RANK"] = str(cmd.node_rank)
    env["MOTOR_NUM_NODES"] = str(cmd.num_nodes)
    if cmd.master_address:
        env["MOTOR_MASTER_ADDRESS"] = cmd.master_address
    peers = cmd.d2d_peers()
    if peers:
        env["MOTOR_D2D_PEER_IPS"] = ",".join(sorted({p.ip for p in peers}))
    if cmd.engine_type is EngineType.VLLM:
        if ep.kv_port:
            # vLLM listens on VLLM_NIXL_SIDE_CHANNEL_PORT + dp rank: make that sum the planned kv_port
            offset = ep.dp_rank if cmd.dp_size > 1 else 0
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(ep.kv_port - offset)
            env.setdefault("VLLM_NIXL_SIDE_CHANNEL_HOST", ep.ip)
        if not env.get("VLLM_HOST_IP"):
            env["VLLM_HOST_IP"] = env.get("POD_IP") or ep.ip
    return env


def plan_launch(
    cmd: StartCommand, settings: LaunchSettings, base_env: Mapping[str, str]
) -> list[LaunchPlan]:
    """One plan per endpoint, ordered by endpoint id (the local index drives device visibility)."""
    prefix = command_prefix(settings, cmd.engine_type)
    sim_args: tuple[str, ...] = ()
    if settings.launcher == "simulator" and settings.zmq_pub_port:
        sim_args = ("--sim-zmq-pub-port", str(settings.zmq_pub_port))
    plans = []
    for index, ep in enumerate(sorted(cmd.endpoints, key=lambda e: e.id)):
        args = _vllm_args(cmd, ep, settings) if cmd.engine_type is EngineType.VLLM else _sglang_args(cmd, ep, settings)
        args += _kv_events_args(cmd, ep, settings)
        argv = (*prefix, *args, *sim_args, *settings.extra_args)
        plans.append(LaunchPlan(ep, index, argv, engine_env(cmd, ep, index, settings, base_env)))
    return plans


def settings_from(
    *,
    launcher: str,
    model_path: str,
    local_world_size: int,
    device_count: int,
    visible_devices_env: str,
    command: Sequence[str] | None,
    extra_args: Sequence[str],
    env: Mapping[str, str],
    kv_connector: str,
    zmq_pub_port: int | None,
    simulator_bin: str = "motor-sim",
    kv_events_topic: str | None = None,
) -> LaunchSettings:
    return LaunchSettings(
        launcher=launcher,
        model_path=model_path,
        local_world_size=local_world_size,
        device_count=device_count,
        visible_devices_env=visible_devices_env,
        command=tuple(command) if command else None,
        extra_args=tuple(extra_args),
        env=tuple(sorted(env.items())),
        kv_connector=kv_connector,
        zmq_pub_port=zmq_pub_port,
        simulator_bin=simulator_bin,
        kv_events_topic=kv_events_topic,
    )
