"""The example fleet configs (examples/fleet-*.yaml) stay loadable and launch what their comments say.

Fast, no engine, no venv needed (not marked ``realengine``): ``motor up``'s plan with each example is
written out and loaded by every program's own strict config loader, and the nodemanager's command
line for each role is built from the resolved configuration.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from motor_cli.fleet import FleetOptions, plan_fleet
from motor_common.config import load_config, read_config_file
from motor_common.domain import Endpoint, EngineType, Role
from motor_controller.config import ControllerConfig
from motor_coordinator.config import CoordinatorConfig
from motor_gateway.config import GatewayConfig
from motor_nodemanager import config as nm_config
from motor_nodemanager.launch import plan_launch, settings_from
from motor_nodemanager.start_command import StartCommand

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _argv_and_env(path: Path, engine: str, role: str, tmp: Path) -> tuple[tuple[str, ...], dict[str, str]]:
    """Plan ``motor up --config <path>`` with one node of *role*, load every program's config, and
    build that node's engine command line."""
    state = tmp / "state"
    counts = {"prefill": 0, "decode": 0, "union": 0, role: 1}
    if role != "union":
        counts = {"prefill": 1, "decode": 1, "union": 0}
    opts = FleetOptions(**counts, engine=engine, model="m", state_dir=state, key_file=state / "key",  # type: ignore[arg-type]
                        node_ports=tuple(range(30000, 30000 + sum(counts.values()))),
                        overrides=read_config_file(str(path)))  # fmt: skip
    state.mkdir(parents=True, exist_ok=True)
    plan = plan_fleet(opts, Path("/bin"))
    loaders = {"controller": ControllerConfig, "coordinator": CoordinatorConfig, "gateway": GatewayConfig}
    nm = None
    for spec in plan.programs:
        spec.config_path.write_text(json.dumps(spec.config))
        if spec.kind == "nodemanager":
            cfg = nm_config.load(str(spec.config_path), {})
            if spec.role == role:
                nm = cfg
        else:
            load_config(loaders[spec.kind], spec.config_path, environ={})
    assert nm is not None
    s = settings_from(launcher=nm.launcher, model_path=nm.model_path, local_world_size=nm.local_world_size,
                      device_count=nm.device_count, visible_devices_env=nm.visible_devices_env,
                      command=nm.engine.command, extra_args=nm.engine.extra_args, env=nm.engine.env,
                      kv_connector=nm.engine.kv_connector, zmq_pub_port=None)  # fmt: skip
    ep = Endpoint(0, "127.0.0.1", 18000, bootstrap_port=19000 if role == "prefill" else 0, kv_port=17000)
    cmd = StartCommand(instance_id=1, job_name=nm.job_name, role=Role(role), engine_type=EngineType(engine),
                       model_name=nm.model_name, endpoints=(ep,))  # fmt: skip
    [p] = plan_launch(cmd, s, {})
    return p.argv, dict(p.env)


def test_cpu_example_launches_real_vllm_union_with_the_plain_vllm_flags(tmp_path: Path) -> None:
    argv, env = _argv_and_env(EXAMPLES / "fleet-real-vllm-cpu.yaml", "vllm", "union", tmp_path)
    assert argv == ("scripts/real-vllm", "serve", ".real-engine/tiny-llama", "--host", "127.0.0.1",
                    "--port", "18000", "--served-model-name", "m", "--enforce-eager")  # fmt: skip
    assert env["VLLM_HOST_IP"] == "127.0.0.1"


@pytest.mark.parametrize("role,kv_role,core", [("prefill", "kv_producer", "0"), ("decode", "kv_consumer", "1")])
def test_cpu_example_launches_a_nixl_pd_pair_each_engine_on_its_own_core(
    role: str, kv_role: str, core: str, tmp_path: Path
) -> None:
    argv, env = _argv_and_env(EXAMPLES / "fleet-real-vllm-cpu.yaml", "vllm", role, tmp_path)
    assert argv[:3] == ("scripts/real-vllm", "serve", ".real-engine/tiny-llama") and argv[-1] == "--enforce-eager"
    assert json.loads(argv[argv.index("--kv-transfer-config") + 1]) == {"kv_connector": "NixlConnector",
                                                                      "kv_role": kv_role}  # fmt: skip
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == core
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "17000" and env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"


@pytest.mark.parametrize("role,kv_role", [("prefill", "kv_producer"), ("decode", "kv_consumer")])
def test_vllm_gpu_example_pins_one_gpu_per_role_and_sets_the_kv_role(role: str, kv_role: str, tmp_path: Path) -> None:
    argv, env = _argv_and_env(EXAMPLES / "fleet-vllm-gpu.yaml", "vllm", role, tmp_path)
    gpu = {"prefill": "0", "decode": "1"}[role]
    assert argv[:5] == ("env", f"CUDA_VISIBLE_DEVICES={gpu}", "vllm", "serve", "Qwen/Qwen2.5-7B-Instruct")
    ktc = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert ktc == {"kv_connector": "NixlConnector", "kv_role": kv_role}
    assert "--data-parallel-rank" not in argv and "--gpu-memory-utilization" in argv
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "17000"


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_sglang_gpu_example_runs_sglang_from_its_own_python(role: str, tmp_path: Path) -> None:
    argv, _ = _argv_and_env(EXAMPLES / "fleet-sglang-gpu.yaml", "sglang", role, tmp_path)
    assert argv[2:5] == ("/opt/sglang/bin/python", "-m", "sglang.launch_server")
    assert argv[argv.index("--disaggregation-mode") + 1] == role
    assert ("--disaggregation-bootstrap-port" in argv) == (role == "prefill")
