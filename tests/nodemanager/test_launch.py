"""Engine argv/env per engine and role (pure)."""

from __future__ import annotations

import json

from motor_common.domain import Endpoint, EngineType, Role
from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as pb
from motor_nodemanager.launch import LaunchSettings, plan_launch, visible_devices
from motor_nodemanager.servicer import start_command_from_pb
from motor_nodemanager.start_command import StartCommand


def cmd(engine: EngineType, role: Role, n: int = 2, **kw: object) -> StartCommand:
    eps = tuple(Endpoint(i, "10.0.0.1", 8000 + i, bootstrap_port=9000 + i, kv_port=7000 + i, dp_rank=4 + i)
                for i in range(n))  # fmt: skip
    base: dict[str, object] = dict(
        instance_id=7, job_name="j", role=role, engine_type=engine, model_name="m", endpoints=eps,
        dp_size=8, master_address="10.0.0.9", master_port=13345,
    )  # fmt: skip
    base.update(kw)
    return StartCommand(**base)  # type: ignore[arg-type]


def settings(launcher: str, **kw: object) -> LaunchSettings:
    return LaunchSettings(launcher=launcher, model_path="/models/m", **kw)  # type: ignore[arg-type]


def flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_vllm_prefill_argv_has_kv_producer_and_dp_flags() -> None:
    plans = plan_launch(cmd(EngineType.VLLM, Role.PREFILL), settings("vllm"), {})
    argv = plans[1].argv
    assert argv[:3] == ("vllm", "serve", "/models/m")
    assert (flag(argv, "--host"), flag(argv, "--port"), flag(argv, "--served-model-name")) == ("10.0.0.1", "8001", "m")
    assert json.loads(flag(argv, "--kv-transfer-config")) == {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    assert flag(argv, "--data-parallel-size") == "8"
    assert flag(argv, "--data-parallel-rank") == "5"
    assert flag(argv, "--data-parallel-address") == "10.0.0.9"
    assert flag(argv, "--data-parallel-rpc-port") == "13345"


def test_vllm_decode_is_kv_consumer_and_union_has_no_connector() -> None:
    d = plan_launch(cmd(EngineType.VLLM, Role.DECODE), settings("vllm"), {})[0].argv
    assert json.loads(flag(d, "--kv-transfer-config"))["kv_role"] == "kv_consumer"
    u = plan_launch(cmd(EngineType.VLLM, Role.UNION, dp_size=2), settings("vllm"), {})[0].argv
    assert "--kv-transfer-config" not in u


def test_vllm_single_engine_has_no_dp_flags() -> None:
    argv = plan_launch(cmd(EngineType.VLLM, Role.DECODE, n=1, dp_size=1), settings("vllm"), {})[0].argv
    assert "--data-parallel-size" not in argv
    # real vLLM 0.32 refuses --data-parallel-rank with size 1 (tests/realengine/test_launch_flags.py)
    assert "--data-parallel-rank" not in argv and "--data-parallel-address" not in argv


def test_vllm_env_side_channel_port_lands_on_kv_port_and_host_ip_defaults_to_pod_ip() -> None:
    plans = plan_launch(cmd(EngineType.VLLM, Role.PREFILL), settings("vllm"), {"POD_IP": "10.9.9.9"})
    env = plans[1].env
    # vLLM listens on VLLM_NIXL_SIDE_CHANNEL_PORT + dp rank
    assert int(env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) + 5 == 7001
    assert env["VLLM_HOST_IP"] == "10.9.9.9"
    kept = plan_launch(cmd(EngineType.VLLM, Role.PREFILL), settings("vllm"), {"POD_IP": "1.1.1.1", "VLLM_HOST_IP": "2.2.2.2"})
    assert kept[0].env["VLLM_HOST_IP"] == "2.2.2.2"
    no_pod = plan_launch(cmd(EngineType.VLLM, Role.PREFILL), settings("vllm"), {})
    assert no_pod[0].env["VLLM_HOST_IP"] == "10.0.0.1"


def test_sglang_prefill_argv_has_bootstrap_port_and_multinode_flags() -> None:
    c = cmd(EngineType.SGLANG, Role.PREFILL, num_nodes=2, node_rank=1)
    argv = plan_launch(c, settings("sglang"), {})[0].argv
    assert argv[1:3] == ("-m", "sglang.launch_server")
    assert flag(argv, "--model-path") == "/models/m"
    assert flag(argv, "--disaggregation-mode") == "prefill"
    assert flag(argv, "--disaggregation-bootstrap-port") == "9000"
    assert flag(argv, "--dp-size") == "8"
    assert (flag(argv, "--dist-init-addr"), flag(argv, "--nnodes"), flag(argv, "--node-rank")) == (
        "10.0.0.9:13345", "2", "1",
    )  # fmt: skip
    assert "VLLM_HOST_IP" not in plan_launch(c, settings("sglang"), {})[0].env


def test_sglang_decode_has_no_bootstrap_port_and_union_no_disaggregation() -> None:
    d = plan_launch(cmd(EngineType.SGLANG, Role.DECODE), settings("sglang"), {})[0].argv
    assert flag(d, "--disaggregation-mode") == "decode"
    assert "--disaggregation-bootstrap-port" not in d
    u = plan_launch(cmd(EngineType.SGLANG, Role.UNION), settings("sglang"), {})[0].argv
    assert "--disaggregation-mode" not in u


def test_simulator_uses_the_engine_flags_behind_motor_sim() -> None:
    v = plan_launch(cmd(EngineType.VLLM, Role.PREFILL), settings("simulator", simulator_bin="sim"), {})[0]
    native = plan_launch(cmd(EngineType.VLLM, Role.PREFILL), settings("vllm"), {})[0]
    assert v.argv[:3] == ("sim", "vllm", "serve")
    assert v.argv[3:] == native.argv[2:]
    s = plan_launch(cmd(EngineType.SGLANG, Role.DECODE), settings("simulator", simulator_bin="sim"), {})[0]
    assert s.argv[:2] == ("sim", "sglang")


def test_command_override_and_extra_args_and_env() -> None:
    s = settings("vllm", command=("/opt/vllm", "serve"), extra_args=("--enforce-eager",), env=(("A", "1"),))
    plan = plan_launch(cmd(EngineType.VLLM, Role.DECODE), s, {"PATH": "/bin"})[0]
    assert plan.argv[:2] == ("/opt/vllm", "serve")
    assert plan.argv[-1] == "--enforce-eager"
    assert plan.env["A"] == "1" and plan.env["PATH"] == "/bin"
    assert plan.env["MOTOR_INSTANCE_ID"] == "7" and plan.env["MOTOR_DP_RANK"] == "4"


def test_visible_devices_window_wraps_cyclically() -> None:
    assert visible_devices(0, 2, 8) == "0,1"
    assert visible_devices(3, 2, 8) == "6,7"
    assert visible_devices(4, 2, 8) == "0,1"
    assert visible_devices(1, 3, 4) == "3,0,1"


def test_visible_devices_env_name_is_configurable_and_per_local_index() -> None:
    s = settings("vllm", local_world_size=4, device_count=6, visible_devices_env="ASCEND_RT_VISIBLE_DEVICES")
    plans = plan_launch(cmd(EngineType.VLLM, Role.DECODE), s, {})
    assert [p.env["ASCEND_RT_VISIBLE_DEVICES"] for p in plans] == ["0,1,2,3", "4,5,0,1"]
    assert flag(plans[0].argv, "--tensor-parallel-size") == "4"
    assert "CUDA_VISIBLE_DEVICES" not in plans[0].env


def test_d2d_peers_are_filtered_by_endpoint_id() -> None:
    peers = (Endpoint(0, "10.0.0.1", 8000), Endpoint(5, "10.0.0.2", 8000))
    plan = plan_launch(cmd(EngineType.VLLM, Role.DECODE, peers=peers), settings("vllm"), {})[0]
    assert plan.env["MOTOR_D2D_PEER_IPS"] == "10.0.0.2"


def test_d2d_peers_exclude_own_endpoint_ids_whatever_their_ip_and_keep_other_ids_on_the_same_ip() -> None:
    peers = (
        Endpoint(1, "10.0.0.7", 8001),  # own id (1) announced from another ip: still excluded
        Endpoint(2, "10.0.0.1", 8002),  # same ip as this node, other id: a peer
        Endpoint(3, "10.0.0.3", 8003),
        Endpoint(4, "10.0.0.3", 8004),  # two peers on one host: one ip in the list
    )
    c = cmd(EngineType.SGLANG, Role.DECODE, peers=peers)
    assert [p.id for p in c.d2d_peers()] == [2, 3, 4]
    for plan in plan_launch(c, settings("simulator"), {}):
        assert plan.env["MOTOR_D2D_PEER_IPS"] == "10.0.0.1,10.0.0.3"
    assert "MOTOR_D2D_PEER_IPS" not in plan_launch(cmd(EngineType.VLLM, Role.DECODE), settings("vllm"), {})[0].env


def test_start_engines_request_peers_reach_the_start_command() -> None:
    req = pb.StartEnginesRequest(
        instance_id=1, job_name="j", role=tpb.ROLE_DECODE, engine_type=tpb.ENGINE_TYPE_VLLM, model_name="m",
        endpoints=[tpb.Endpoint(id=0, ip="10.0.0.1", business_port=8000)],
        peers=[tpb.Endpoint(id=0, ip="10.0.0.1", business_port=8000), tpb.Endpoint(id=9, ip="10.0.0.2", business_port=8000)],
    )  # fmt: skip
    assert [p.id for p in start_command_from_pb(req).d2d_peers()] == [9]


def _with_events(c: StartCommand) -> StartCommand:
    from dataclasses import replace

    eps = tuple(replace(e, kv_events_port=6000 + e.id, kv_events_replay_port=6100 + e.id) for e in c.endpoints)
    return replace(c, endpoints=eps)


def test_vllm_kv_events_config_binds_the_planned_ports_after_vllms_dp_rank_offset() -> None:
    from motor_common.kv_events import Flavour
    from motor_sim.kv_events_pub import parse_kv_events_config

    c = _with_events(cmd(EngineType.VLLM, Role.PREFILL))
    argv = plan_launch(c, settings("vllm", kv_events_topic="kv-events"), {})[1].argv
    cfg = json.loads(flag(argv, "--kv-events-config"))
    # endpoint 1 has dp rank 5 of 8: vLLM publishes on port + 5, which must be the planned 6001
    assert cfg == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5996",
                   "replay_endpoint": "tcp://*:6096", "topic": "kv-events"}  # fmt: skip
    parsed = parse_kv_events_config(Flavour.VLLM, cfg, dp_rank=5)  # the simulator reads it the engine's way
    assert parsed is not None and parsed.endpoint == "tcp://*:6001" and parsed.replay_endpoint == "tcp://*:6101"
    single = plan_launch(_with_events(cmd(EngineType.VLLM, Role.DECODE, n=1, dp_size=1)),
                         settings("vllm", kv_events_topic="t"), {})[0].argv  # fmt: skip
    assert json.loads(flag(single, "--kv-events-config"))["endpoint"] == "tcp://*:6000"


def test_sglang_kv_events_config_has_sglangs_keys_and_no_events_flag_when_off() -> None:
    from motor_common.kv_events import Flavour
    from motor_sim.kv_events_pub import parse_kv_events_config

    c = _with_events(cmd(EngineType.SGLANG, Role.PREFILL))
    argv = plan_launch(c, settings("sglang", kv_events_topic="kv"), {})[0].argv
    cfg = json.loads(flag(argv, "--kv-events-config"))
    assert cfg == {"publisher": "zmq", "endpoint": "tcp://*:6000", "replay_endpoint": "tcp://*:6100", "topic": "kv"}
    parsed = parse_kv_events_config(Flavour.SGLANG, cfg)
    assert parsed is not None and parsed.endpoint == "tcp://*:6000"
    assert "--kv-events-config" not in plan_launch(c, settings("sglang"), {})[0].argv  # topic None: off
    no_ports = plan_launch(cmd(EngineType.SGLANG, Role.PREFILL), settings("sglang", kv_events_topic="kv"), {})
    assert "--kv-events-config" not in no_ports[0].argv  # endpoints without planned ports: off
