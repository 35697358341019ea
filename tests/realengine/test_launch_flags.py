"""The nodemanager's vLLM command lines, fed to real vLLM 0.32's own argument parser and engine-config
builder (``make_arg_parser`` → ``validate_parsed_serve_args`` → ``create_engine_config``): every flag
we emit must be accepted, without loading a model or starting an engine (≈10 s, mostly the import).

Pins two facts of vLLM 0.32 as well: ``--data-parallel-rank`` with data-parallel size 1 is refused
(so the nodemanager must emit DP flags only for ``dp_size > 1``), and external-LB data parallelism
(``--data-parallel-rank``, what the nodemanager uses for DP > 1) is refused for dense models — vLLM
only supports it for MoE models.
"""

from __future__ import annotations

import json
import os
import subprocess

from motor_common.domain import Endpoint, EngineType, Role
from motor_nodemanager.launch import LaunchSettings, plan_launch
from motor_nodemanager.start_command import StartCommand
from tests.realengine.test_vllm_vs_simulator import MODEL_DIR, ROOT, VENV, lane

VENV_PY = VENV / "bin" / "python"

pytestmark = lane(180, slow=False)

# Runs in the real-engine venv: argv lists (JSON on stdin) → {"name": "OK ..." | "REJECTED: ..."}.
CHECKER = r"""
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.engine.arg_utils import AsyncEngineArgs
out = {}
for name, args in json.load(sys.stdin).items():
    try:
        ns = make_arg_parser(FlexibleArgumentParser()).parse_args(args)
        validate_parsed_serve_args(ns)
        cfg = AsyncEngineArgs.from_cli_args(ns).create_engine_config()
        kv = cfg.kv_transfer_config
        out[name] = {"ok": True, "served": list(ns.served_model_name or []), "host": ns.host, "port": ns.port,
                     "tp": cfg.parallel_config.tensor_parallel_size,
                     "kv": None if kv is None else [kv.kv_connector, kv.kv_role]}
    except SystemExit as exc:
        out[name] = {"ok": False, "error": f"argparse exit {exc.code}"}
    except Exception as exc:
        out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
print("RESULT " + json.dumps(out))
"""


def _cmd(role: Role, n: int = 1, dp: int = 1, **kw: object) -> StartCommand:
    eps = tuple(Endpoint(i, "127.0.0.1", 18000 + i, kv_port=17000 + i, dp_rank=i) for i in range(n))
    return StartCommand(instance_id=7, job_name="j", role=role, engine_type=EngineType.VLLM,
                        model_name="tiny", endpoints=eps, dp_size=dp, **kw)  # type: ignore[arg-type]  # fmt: skip


def _vllm_args(plan_argv: tuple[str, ...]) -> list[str]:
    """``<prefix> serve MODEL flags…`` → the api_server's arguments (``--model MODEL flags…``)."""
    assert plan_argv[:2] == ("scripts/real-vllm", "serve"), plan_argv
    model, *flags = plan_argv[2:]
    return ["--model", model, "--max-model-len", "256", "--max-num-seqs", "4", "--dtype", "float32", *flags]


def test_nodemanager_vllm_argv_is_accepted_by_real_vllm() -> None:
    assert MODEL_DIR.is_dir(), "no .real-engine/tiny-llama: run scripts/real-engine-setup"
    s = LaunchSettings(launcher="vllm", model_path=str(MODEL_DIR), command=("scripts/real-vllm", "serve"))
    tp2 = LaunchSettings(launcher="vllm", model_path=str(MODEL_DIR), command=("scripts/real-vllm", "serve"),
                         local_world_size=2)  # fmt: skip
    union = plan_launch(_cmd(Role.UNION), s, {})[0].argv
    plans = {
        "union": union,
        "prefill": plan_launch(_cmd(Role.PREFILL), s, {})[0].argv,
        "decode": plan_launch(_cmd(Role.DECODE), s, {})[0].argv,
        "union_tp2": plan_launch(_cmd(Role.UNION), tp2, {})[0].argv,
        "prefill_dp2_rank1": plan_launch(
            _cmd(Role.PREFILL, n=2, dp=2, master_address="127.0.0.1", master_port=13345), s, {}
        )[1].argv,
        # what the nodemanager must NOT emit for a single engine (vLLM refuses it)
        "union_dp1_rank0": (*union, "--data-parallel-size", "1", "--data-parallel-rank", "0"),
    }
    assert "--data-parallel-rank" not in union and "--kv-transfer-config" not in union
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run([str(VENV_PY), "-c", CHECKER], input=json.dumps({k: _vllm_args(v) for k, v in plans.items()}),
                          capture_output=True, text=True, timeout=150, env=env, cwd=ROOT)  # fmt: skip
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, f"checker failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    res = json.loads(line.removeprefix("RESULT "))
    print("\n" + "\n".join(f"  {k}: {v}" for k, v in res.items()))

    for name in ("union", "prefill", "decode", "union_tp2"):
        assert res[name]["ok"], f"real vLLM 0.32 rejected the nodemanager's {name} argv: {res[name]['error']}"
        assert res[name]["served"] == ["tiny"] and res[name]["host"] == "127.0.0.1"
    assert res["union"]["port"] == 18000 and res["union"]["kv"] is None
    assert res["prefill"]["kv"] == ["NixlConnector", "kv_producer"]
    assert res["decode"]["kv"] == ["NixlConnector", "kv_consumer"]
    assert res["union_tp2"]["tp"] == 2
    # vLLM 0.32 facts the nodemanager's DP launch depends on
    assert not res["union_dp1_rank0"]["ok"]
    assert "data_parallel_size > 1" in res["union_dp1_rank0"]["error"]
    assert not res["prefill_dp2_rank1"]["ok"]
    assert "Non-MoE models do not support external data parallel mode" in res["prefill_dp2_rank1"]["error"]
