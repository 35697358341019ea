"""Compile the per-request hot path with mypyc into a scratch tree (not a test, not packaging).

    .venv/bin/python bench/mypyc_build.py --out /tmp/motor-mypyc [--modules a.b,c.d] [--opt-level 3]
    cp -r /tmp/motor-mypyc /tmp/motor-plain && find /tmp/motor-plain -name '*.so' -delete
    .venv/bin/python bench/tree_ab.py --base /tmp/motor-plain --new /tmp/motor-mypyc --co-located \
        --rounds 8 --seconds 3 --conc 1,64
    .venv/bin/python bench/mypyc_build.py --out /tmp/motor-mypyc --micro 6   # in process

Copies ``motor_common``, ``motor_coordinator`` and ``motor_gateway`` from this tree into one flat
directory, ``<out>/common`` (so ``tree_ab.py --base/--new <out>`` puts all three first on
``PYTHONPATH``; its other two entries do not exist and are skipped; the plain copy, the same
sources without the ``.so`` files, is the fair interpreted side), and runs mypyc on
:data:`HOT_PATH` there: every listed module becomes an extension module next to its ``.py``, which
Python imports in its place; the rest stays interpreted. Needs a C compiler and Python's headers.
The list is what ``bench/profile_motor.py`` shows on the per-request path of the co-located front
and of the gateway that mypyc can compile (the OpenAI front, request parsing, the body rewrites,
dispatch trace, the gateway's mux), all strictly typed. Not in it: the modules with async
generators (dispatcher, engine_client, http_front, scheduler, request_metrics, dispatch_mux,
dispatch_service, motor_gateway.client; mypyc: "async generators are unimplemented") and the
policies (their class-level ``name`` becomes an instance attribute). The result is recorded in
docs/benchmarks.md ("mypyc on the hot path").
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# package -> its source root in this repository
PACKAGES = {
    "motor_common": ROOT / "common",
    "motor_coordinator": ROOT / "services" / "coordinator",
    "motor_gateway": ROOT / "gateway",
}

# The per-request path mypyc compiles, by py-spy's own samples (co-located front, c=64, 2026-12-02):
# 10.5 % of the samples, against 18 % in the modules with async generators (see the docstring).
HOT_PATH: tuple[str, ...] = (
    "motor_common.domain",
    "motor_common.openai_bounds",
    "motor_common.stall_clock",
    "motor_common.openai_front.access_log",
    "motor_common.openai_front.admission",
    "motor_common.openai_front.app",
    "motor_common.openai_front.dispatch",
    "motor_common.openai_front.limits",
    "motor_common.openai_front.metrics",
    "motor_common.openai_front.openai",
    "motor_coordinator.adapters.base",
    "motor_coordinator.adapters.sglang",
    "motor_coordinator.adapters.vllm",
    "motor_coordinator.breaker",
    "motor_coordinator.dispatch_trace",
    "motor_coordinator.liveness",
    "motor_coordinator.passthrough",
    "motor_coordinator.policies.base",
    "motor_coordinator.precision_routing",
    "motor_coordinator.request",
    "motor_coordinator.validation",
    "motor_gateway.failover",
    "motor_gateway.mux",
    "motor_gateway.routing",
)

# mypy's settings for the build: the project's strict ones (pyproject.toml), for the flat layout
_MYPY_INI = """\
[mypy]
strict = True
untyped_calls_exclude = motor_common.gen, kubernetes
exclude = motor_common/gen/

[mypy-motor_common.gen.*,google.rpc.*,grpc.*,grpc_health.*,grpc_reflection.*,aetcd.*,zmq.*,kubernetes.*]
ignore_missing_imports = True
ignore_errors = True

[mypy-motor_common.grpc_server]
disallow_subclassing_any = False
warn_return_any = False
"""

# Source changes mypyc needs, made in the scratch copy only: (module, old, new), each old text must
# occur exactly once. aiohttp's ``@web.middleware`` sets an attribute on the function, which a
# compiled function does not take; a ``functools.partial`` of the compiled method does. A compiled
# (native) class cannot be weakly referenced, and the gateway keeps its muxes in a ``WeakSet``:
# ``DispatchMux`` stays a Python class (its methods are still compiled).
PATCHES: tuple[tuple[str, str, str], ...] = (
    ("motor_gateway.mux", "\nimport weakref\n", "\nimport weakref\n\nfrom mypy_extensions import mypyc_attr\n"),
    ("motor_gateway.mux", "\nclass DispatchMux:", "\n@mypyc_attr(native_class=False)\nclass DispatchMux:"),
    ("motor_common.openai_front.app", "    @web.middleware\n    async def _middleware(",
     "    async def _middleware("),
    ("motor_common.openai_front.app", "middlewares=[self._middleware]",
     "middlewares=[web.middleware(__import__('functools').partial(self._middleware))]"),
)

_SETUP = """\
import sys
from setuptools import setup
from mypyc.build import mypycify
setup(name="motor-mypyc-scratch", ext_modules=mypycify(["--config-file", "mypyc.ini", *sys.argv[2:]],
      opt_level=sys.argv[1]), script_args=["build_ext", "--inplace", "--parallel", "2"])
"""


def module_path(module: str) -> Path:
    """The source file of *module* in this repository (``ValueError`` if it is not one of ours)."""
    package = module.split(".")[0]
    if package not in PACKAGES:
        raise ValueError(f"{module}: not in {sorted(PACKAGES)}")
    return PACKAGES[package].joinpath(*module.split(".")).with_suffix(".py")


def build(out: Path, modules: tuple[str, ...], opt_level: str) -> Path:
    """Copy the packages into ``out/common`` and compile *modules* there; return that directory."""
    site = out / "common"
    if out.exists():
        shutil.rmtree(out)
    site.mkdir(parents=True)
    for package, root in PACKAGES.items():
        shutil.copytree(root / package, site / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"))
    for module, old, new in PATCHES:
        if module not in modules:
            continue
        path = site.joinpath(*module.split(".")).with_suffix(".py")
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"{module}: the text to patch for mypyc is not there once: {old!r}")
        path.write_text(text.replace(old, new))
    (site / "mypyc.ini").write_text(_MYPY_INI)
    (site / "setup_mypyc.py").write_text(_SETUP)
    files = [str(module_path(m).relative_to(PACKAGES[m.split(".")[0]])) for m in modules]
    env = {**os.environ, "MYPYPATH": ""}
    env.pop("PYTHONPATH", None)
    t0 = time.monotonic()
    subprocess.run([sys.executable, "setup_mypyc.py", opt_level, *files], cwd=site, env=env, check=True)
    print(f"compiled {len(modules)} modules in {time.monotonic() - t0:.0f} s into {site}", flush=True)
    return site


def check(site: Path, modules: tuple[str, ...]) -> None:
    """Import every listed module from *site* in a fresh interpreter; fail unless each is compiled."""
    code = ("import importlib, sys\n"
            "bad = [m for m in sys.argv[1:] if not importlib.import_module(m).__file__.endswith('.so')]\n"
            "sys.exit('not compiled: ' + ', '.join(bad) if bad else 0)\n")
    subprocess.run([sys.executable, "-c", code, *modules], env={**os.environ, "PYTHONPATH": str(site)}, check=True)
    print(f"all {len(modules)} modules import compiled from {site}")


# One PD request's pure per-request work in the compiled modules: the front's body validation, the
# coordinator's parse, the prefill and decode body rewrites and their serialisation (orjson).
_MICRO = """\
import sys, time, orjson
from motor_common.openai_front.openai import validate_body
from motor_coordinator.request import parse_body
from motor_coordinator.adapters.vllm import vllm_decode_body, vllm_prefill_body
import motor_coordinator.request as r
raw = orjson.dumps({"model": "bench", "prompt": "hello " * 20, "max_tokens": 16, "temperature": 0.0})
reply = {"kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [1, 2]}}
def one():
    validate_body(raw, "completions")
    req = parse_body("completions", raw)
    orjson.dumps(vllm_prefill_body(req.body))
    orjson.dumps(vllm_decode_body(req.body, reply))
for _ in range(20000):
    one()
best = []
for _ in range(5):
    t0 = time.process_time()
    for _ in range(50000):
        one()
    best.append((time.process_time() - t0) / 50000 * 1e6)
print(f"{min(best):.2f} {sorted(best)[2]:.2f} {r.__file__.endswith('.so')}")
"""


def micro(site: Path, rounds: int) -> None:
    """CPU microseconds per request of :data:`_MICRO`, interpreted and compiled, interleaved."""
    for rnd in range(rounds):
        for variant in ("interpreted", "compiled") if rnd % 2 == 0 else ("compiled", "interpreted"):
            env = dict(os.environ)
            env.pop("PYTHONPATH", None)
            if variant == "compiled":
                env["PYTHONPATH"] = str(site)
            out = subprocess.run([sys.executable, "-c", _MICRO], env=env, check=True, capture_output=True,
                                 text=True).stdout.split()
            print(f"round {rnd} {variant:11} validate+parse+rewrite+dumps: best {out[0]} us, "
                  f"median {out[1]} us (compiled modules loaded: {out[2]})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="scratch directory (replaced)")
    ap.add_argument("--modules", help="comma-separated module names (default: the hot path list)")
    ap.add_argument("--opt-level", default="3", choices=["0", "1", "2", "3"])
    ap.add_argument("--micro", type=int, metavar="ROUNDS", default=0,
                    help="only time one request's validation and body rewrites, interpreted vs the "
                         "tree already built at --out, ROUNDS interleaved rounds")
    a = ap.parse_args()
    if a.micro:
        micro(a.out.resolve() / "common", a.micro)
        return
    modules = tuple(a.modules.split(",")) if a.modules else HOT_PATH
    site = build(a.out.resolve(), modules, a.opt_level)
    check(site, modules)


if __name__ == "__main__":
    main()
