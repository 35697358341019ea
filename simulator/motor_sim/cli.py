"""Command line: ``motor-sim vllm serve <model> [flags]`` and ``motor-sim sglang [flags]`` (``--help``: ``_HELP``).

Accepts the subset of each engine's own flags that Motor uses (plus a few harmless ones); an
unknown flag exits with code 2 and an argparse error, as the engines do. Simulator-only knobs are
``--sim-*`` flags, each defaulting to the environment variable ``MOTOR_SIM_<NAME>``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from motor_common.kv_events import Flavour as KvEventFlavour
from motor_common.version import version_line
from motor_sim.config import Flavour, Role, SimConfig
from motor_sim.costmodel import CostModel
from motor_sim.faults import FaultMode
from motor_sim.kv_events_pub import KvEventsConfig, parse_kv_events_config

log = logging.getLogger("motor_sim")

# (flag, type, default, help); env MOTOR_SIM_<FLAG without --sim- upper, '-'→'_'> overrides default
_SIM_FLAGS: list[tuple[str, Callable[[str], Any] | str, Any, str]] = [
    ("--sim-zero-latency", "bool", False, "no sleeps at all (throughput benchmarks)"),
    ("--sim-prefill-base-ms", float, 2.0, "fixed prefill cost per request"),
    ("--sim-prefill-ms-per-token", float, 0.05, "prefill cost per uncached prompt token"),
    ("--sim-prefill-slots", int, 0, "prefills that compute at once, the rest queue FIFO (0: unbounded)"),
    ("--sim-decode-ms-per-token", float, 5.0, "decode interval at batch size 0"),
    ("--sim-decode-ms-per-seq", float, 0.1, "decode interval growth per running sequence"),
    ("--sim-kv-transfer-ms-per-block", float, 0.02, "KV transfer cost per block"),
    ("--sim-num-kv-blocks", int, 8192, "KV cache size in blocks of 16 tokens"),
    ("--sim-default-max-tokens", int, 64, "max_tokens when the request gives none"),
    ("--sim-no-prefix-caching", "bool", False, "disable the prefix cache"),
    ("--sim-fault", str, "none", "fault at start-up: " + "|".join(m.value for m in FaultMode)),
    ("--sim-crash-after-s", float, None, "crash (exit 1) this many seconds after start-up"),
    ("--sim-ignore-sigterm", "bool", False, "ignore SIGTERM like a wedged engine (only SIGKILL stops it)"),
    ("--sim-kv-lease-s", float, None, "pinned-KV lease (default VLLM_NIXL_ABORT_REQUEST_TIMEOUT or 480)"),
    ("--sim-kv-fetch-timeout-s", float, 5.0, "decode-side side-channel fetch timeout"),
    ("--sim-side-channel-host", str, None, "advertised side-channel host"),
    ("--sim-side-channel-port", int, None, "side-channel base port (default VLLM_NIXL_SIDE_CHANNEL_PORT or 5600); + dp rank"),
    ("--sim-bootstrap-timeout-s", float, None, "SGLang prefill: wait for decode to take a room"),
    ("--sim-waiting-timeout-s", float, None, "SGLang decode: wait for the prefill of a room"),
    ("--sim-zmq-pub-port", int, None, "vllm_fault ZMQ PUB base port (+ dp rank); off if unset"),
    ("--sim-zmq-interval-s", float, 1.0, "vllm_fault publish interval"),
    ("--sim-engine-id", str, None, "engine id (default: kv-transfer-config engine_id or a uuid)"),
    ("--sim-log-level", str, "info", "log level"),
]


def _env_default(flag: str, conv: Callable[[str], Any] | str, default: Any) -> Any:
    env = "MOTOR_SIM_" + flag[len("--sim-"):].upper().replace("-", "_")
    raw = os.environ.get(env)
    if raw is None:
        return default
    if isinstance(conv, str):  # "bool"
        return raw.strip().lower() in ("1", "true", "yes", "on")
    return conv(raw)


def _add_sim_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("motor-sim (simulator only)")
    for flag, conv, default, help_ in _SIM_FLAGS:
        d = _env_default(flag, conv, default)
        if isinstance(conv, str):
            g.add_argument(flag, action="store_true", default=d, help=help_)
        else:
            g.add_argument(flag, type=conv, default=d, help=help_)


def _json_arg(text: str) -> dict[str, Any]:
    try:
        val = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON: {exc}") from exc
    if not isinstance(val, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return val


KV_LOAD_FAILURE_POLICIES = ("recompute", "fail")
VLLM_VERSION = "0.32.0"  # the release the vLLM flavour is checked against (tests/realengine)


def vllm_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm serve", allow_abbrev=False)
    p.add_argument("model_tag", nargs="?", default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--kv-transfer-config", type=_json_arg, default=None)
    p.add_argument("--kv-events-config", type=_json_arg, default=None)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--data-parallel-rank", "-dpn", type=int, default=None)
    p.add_argument("--data-parallel-size-local", "-dpl", type=int, default=None)
    p.add_argument("--data-parallel-address", "-dpa", default=None)
    p.add_argument("--data-parallel-rpc-port", "-dpp", type=int, default=None)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=8192)
    # vLLM's --runner: "pooling" serves /v1/embeddings (an embedding model) and no generation routes
    p.add_argument("--runner", choices=["auto", "generate", "pooling", "draft"], default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--disable-log-requests", action="store_true")
    p.add_argument("--enable-request-id-headers", action="store_true")
    p.add_argument("--max-logprobs", type=int, default=20)
    _add_sim_flags(p)
    return p


def sglang_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang.launch_server", allow_abbrev=False)
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--disaggregation-mode", choices=["null", "prefill", "decode"], default="null")
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    p.add_argument("--disaggregation-transfer-backend", default="mooncake")
    p.add_argument("--disaggregation-ib-device", default=None)
    p.add_argument("--dp-size", "--dp", type=int, default=1)
    p.add_argument("--tp-size", "--tp", type=int, default=1)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--dist-init-addr", default=None)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--log-level", default="info")
    p.add_argument("--kv-events-config", type=_json_arg, default=None)
    _add_sim_flags(p)
    return p


def _cost(ns: argparse.Namespace) -> CostModel:
    return CostModel(
        prefill_base_ms=ns.sim_prefill_base_ms,
        prefill_ms_per_token=ns.sim_prefill_ms_per_token,
        decode_ms_per_token=ns.sim_decode_ms_per_token,
        decode_ms_per_seq=ns.sim_decode_ms_per_seq,
        kv_transfer_ms_per_block=ns.sim_kv_transfer_ms_per_block,
        zero_latency=ns.sim_zero_latency,
        prefill_slots=ns.sim_prefill_slots,
    )


def _check_fault(p: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    if ns.sim_fault not in {m.value for m in FaultMode}:
        p.error(f"argument --sim-fault: invalid choice: {ns.sim_fault!r}")
    if ns.sim_fault == FaultMode.POISON.value:
        p.error("argument --sim-fault: poison needs its 'match' bytes: POST /sim/fault instead")
    if ns.sim_prefill_slots < 0:
        p.error(f"argument --sim-prefill-slots: must be 0 (unbounded) or more, not {ns.sim_prefill_slots}")


def _kv_events(p: argparse.ArgumentParser, ns: argparse.Namespace, fl: KvEventFlavour,
               dp_rank: int) -> KvEventsConfig | None:
    if ns.kv_events_config is None:
        return None
    try:
        return parse_kv_events_config(fl, ns.kv_events_config, dp_rank)
    except ValueError as exc:
        p.error(f"argument --kv-events-config: {exc}")


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


def config_from_vllm(argv: Sequence[str]) -> SimConfig:
    p = vllm_parser()
    ns = p.parse_args(argv)
    _check_fault(p, ns)
    model = ns.model or ns.model_tag
    if not model:
        p.error("the following arguments are required: model_tag")
    role = Role.UNION
    ktc = ns.kv_transfer_config
    if ktc is not None:
        roles = {"kv_producer": Role.PREFILL, "kv_consumer": Role.DECODE, "kv_both": Role.BOTH}
        if ktc.get("kv_role") not in roles:
            p.error(f"argument --kv-transfer-config: unsupported kv_role {ktc.get('kv_role')!r}")
        role = roles[ktc["kv_role"]]
        policy = ktc.get("kv_load_failure_policy", "fail")
        if policy not in KV_LOAD_FAILURE_POLICIES:
            # vLLM 0.32: a pydantic error on KVTransferConfig at start-up
            p.error(f"argument --kv-transfer-config: kv_load_failure_policy must be one of "
                    f"{', '.join(repr(x) for x in KV_LOAD_FAILURE_POLICIES)}, got {policy!r}")
    if ns.data_parallel_rank is not None and ns.data_parallel_size <= 1:
        # vLLM 0.32 refuses this too (a pydantic error from ParallelConfig at start-up)
        p.error("data_parallel_external_lb can only be set when data_parallel_size > 1")
    dp_rank = ns.data_parallel_rank or 0
    base_port = ns.sim_side_channel_port
    if base_port is None:
        base_port = int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600"))
    host_ip = os.environ.get("VLLM_HOST_IP") or None
    sc_host = (ns.sim_side_channel_host or os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST")
               or host_ip or "127.0.0.1")
    lease = ns.sim_kv_lease_s
    if lease is None:
        lease = _env_float("VLLM_NIXL_ABORT_REQUEST_TIMEOUT", 480.0)
    engine_id = ns.sim_engine_id or (str(ktc.get("engine_id")) if ktc and ktc.get("engine_id") else "")
    kv_events = _kv_events(p, ns, KvEventFlavour.VLLM, dp_rank)
    return SimConfig(
        flavour=Flavour.VLLM, model=model,
        served_model_names=tuple(ns.served_model_name or [model]),
        host=ns.host, port=ns.port, role=role, kv_transfer_config=ktc, engine_id=engine_id,
        kv_events=kv_events,
        dp_size=ns.data_parallel_size, dp_rank=dp_rank, dp_address=ns.data_parallel_address,
        dp_rpc_port=ns.data_parallel_rpc_port, tp_size=ns.tensor_parallel_size,
        max_num_seqs=ns.max_num_seqs, max_model_len=ns.max_model_len,
        default_max_tokens=ns.sim_default_max_tokens, num_kv_blocks=ns.sim_num_kv_blocks,
        block_size=ns.block_size,
        enable_prefix_caching=ns.enable_prefix_caching and not ns.sim_no_prefix_caching,
        side_channel_host=sc_host, side_channel_port=base_port + dp_rank, kv_lease_s=lease,
        kv_fetch_timeout_s=ns.sim_kv_fetch_timeout_s,
        kv_load_failure_policy=str(ktc.get("kv_load_failure_policy", "fail")) if ktc else "fail",
        cost=_cost(ns),
        initial_fault=ns.sim_fault, crash_after_s=ns.sim_crash_after_s, ignore_sigterm=ns.sim_ignore_sigterm,
        zmq_pub_port=ns.sim_zmq_pub_port, zmq_interval_s=ns.sim_zmq_interval_s,
        version=VLLM_VERSION, request_id_headers=ns.enable_request_id_headers,
        max_logprobs=ns.max_logprobs, pooling=ns.runner == "pooling",
        responses_store=bool(int(os.environ.get("VLLM_ENABLE_RESPONSES_API_STORE", "0") or "0")),
        keepalive_s=_env_float("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", 5.0),
    )


def config_from_sglang(argv: Sequence[str]) -> SimConfig:
    p = sglang_parser()
    ns = p.parse_args(argv)
    _check_fault(p, ns)
    role = {"null": Role.UNION, "prefill": Role.PREFILL, "decode": Role.DECODE}[
        ns.disaggregation_mode]
    boot_to = ns.sim_bootstrap_timeout_s
    if boot_to is None:
        boot_to = _env_float("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 30.0)
    wait_to = ns.sim_waiting_timeout_s
    if wait_to is None:
        wait_to = _env_float("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 30.0)
    return SimConfig(
        flavour=Flavour.SGLANG, model=ns.model_path,
        served_model_names=(ns.served_model_name or ns.model_path,),
        host=ns.host, port=ns.port, role=role, engine_id=ns.sim_engine_id or "",
        kv_events=_kv_events(p, ns, KvEventFlavour.SGLANG, 0),
        dp_size=ns.dp_size, tp_size=ns.tp_size,
        max_num_seqs=ns.max_running_requests or 256,
        max_model_len=ns.context_length or 8192,
        default_max_tokens=ns.sim_default_max_tokens, num_kv_blocks=ns.sim_num_kv_blocks,
        block_size=ns.page_size, enable_prefix_caching=not ns.sim_no_prefix_caching,
        bootstrap_port=ns.disaggregation_bootstrap_port,
        transfer_backend=ns.disaggregation_transfer_backend,
        bootstrap_timeout_s=boot_to, waiting_timeout_s=wait_to, cost=_cost(ns),
        initial_fault=ns.sim_fault, crash_after_s=ns.sim_crash_after_s, ignore_sigterm=ns.sim_ignore_sigterm,
        zmq_pub_port=ns.sim_zmq_pub_port, zmq_interval_s=ns.sim_zmq_interval_s,
    )


_USAGE = "usage: motor-sim {vllm serve <model> | sglang} [flags]  (see --help of each) | --version"
_HELP = f"""{_USAGE}

motor-sim: an LLM engine simulator that speaks vLLM's and SGLang's real HTTP APIs (OpenAI
completions and chat, SSE, /health, /metrics) and their prefill/decode hand-off protocols, with
deterministic output and a cost model instead of a GPU. Motor's nodemanager launches it the way it
launches vLLM; use it for tests, demos and benchmarks.

  motor-sim vllm serve tiny --port 8100                                  # a vLLM-like engine
  motor-sim vllm serve tiny --port 8100 --kv-transfer-config '{{"kv_connector":"NixlConnector","kv_role":"kv_producer"}}'
  motor-sim sglang --model-path tiny --port 8200 --disaggregation-mode prefill
  motor-sim vllm serve tiny --sim-zero-latency                           # no simulated latency

Every simulator-only knob is a --sim-* flag (see `motor-sim vllm serve --help`), each also read
from MOTOR_SIM_<NAME>. Docs: docs/simulator.md in the Motor repository.
"""


def parse(argv: Sequence[str]) -> SimConfig:
    if len(argv) >= 2 and argv[0] == "vllm" and argv[1] == "serve":
        return config_from_vllm(argv[2:])
    if argv and argv[0] == "sglang":
        return config_from_sglang(argv[1:])
    if argv and argv[0] == "--version":
        print(version_line("motor-sim"))
        raise SystemExit(0)
    if argv and argv[0] in ("-h", "--help"):
        print(_HELP, end="")
        raise SystemExit(0)
    print(_USAGE, file=sys.stderr)
    print("motor-sim: error: expected 'vllm serve <model>' or 'sglang'", file=sys.stderr)
    raise SystemExit(2)


def _run(cfg: SimConfig) -> int:
    from motor_sim.server import serve

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a declared dependency on Linux
        return asyncio.run(serve(cfg))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve(cfg))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    cfg = parse(args)
    level = "info"
    for i, a in enumerate(args):
        if a == "--sim-log-level" and i + 1 < len(args):
            level = args[i + 1]
    level = os.environ.get("MOTOR_SIM_LOG_LEVEL", level)
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(levelname)s %(asctime)s [%(name)s] %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if cfg.initial_fault == FaultMode.REFUSE_START.value:
        log.error("fault injection: refusing to start (--sim-fault refuse_start)")
        return 1
    return _run(cfg)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
