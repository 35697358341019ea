"""A/B of two source trees of Motor, interleaved (not a test): is a change to the hot path faster?

    git archive <base-commit> | (mkdir -p /tmp/motor-base && tar -x -C /tmp/motor-base)
    .venv/bin/python bench/tree_ab.py --base /tmp/motor-base [--flavour vllm|sglang] [--stream]
                                      [--co-located] [--rounds 3] [--seconds 2] [--conc 1,64]
                                      [--new /tmp/motor-new]

The same engines throughout (this tree's simulator); per round Motor is started from each tree in
turn — ``base``: ``motor-coordinator`` and ``motor-gateway`` with ``PYTHONPATH`` pointing at the
other tree's packages (they come before this venv's editable install), ``new``: this tree — and
measured at each concurrency, so a machine whose load drifts during the run biases neither.
``--new DIR``: ``new`` is started from that tree the same way as ``base`` (both from
``PYTHONPATH``; e.g. two scratch copies, one of them compiled by ``bench/mypyc_build.py``).
``--base-bin DIR`` / ``--new-bin DIR``: that variant's console scripts (``motor-coordinator``,
``motor-gateway``, ``motor``) come from DIR, another venv's ``bin``: the same tree on another Python,
e.g. ``--base . --new . --new-bin /tmp/venv313/bin`` (that venv: this tree's dependencies, ``pip
install -e .``; ``PYTHONPATH`` still points both at this tree's packages).
Prints every measurement and the medians: CPU microseconds per request of the Motor process
tree, req/s, p50.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.ab import Results, measure, print_medians
from bench.common import ZERO, start_engines, start_motor
from tests import conftest

_PACKAGES = ("common", "gateway", "services/coordinator")


async def main(a: argparse.Namespace) -> None:
    paths = {v: os.pathsep.join(str(Path(tree).resolve() / p) for p in _PACKAGES)
             for v, tree in (("base", a.base), ("new", a.new)) if tree}
    res: Results = {}
    bins = {"base": a.base_bin, "new": a.new_bin}
    own_bin = conftest.BIN
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        async with start_engines(a.flavour, d, ZERO) as e:
            for rnd in range(a.rounds):
                for v in ("base", "new") if rnd % 2 == 0 else ("new", "base"):
                    saved = os.environ.get("PYTHONPATH")
                    if v in paths:
                        os.environ["PYTHONPATH"] = paths[v]
                    if bins[v]:
                        conftest.BIN = Path(bins[v])
                    try:
                        motor = start_motor(e, d, name=v, co_located=a.co_located)
                        t = await motor.__aenter__()
                    finally:
                        conftest.BIN = own_bin
                        if saved is None:
                            os.environ.pop("PYTHONPATH", None)
                        else:
                            os.environ["PYTHONPATH"] = saved
                    try:
                        await measure(t, v, rnd, a.conc, a.stream, a.seconds, res)
                    finally:
                        await motor.__aexit__(None, None, None)
    print_medians(res)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


if __name__ == "__main__":
    from motor_common.runner import install_uvloop

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="a checkout (or git archive) of the tree to compare against")
    ap.add_argument("--new", help="start 'new' from this tree too (default: this checkout)")
    ap.add_argument("--base-bin", help="start 'base' with the console scripts of this venv bin directory")
    ap.add_argument("--new-bin", help="start 'new' with the console scripts of this venv bin directory")
    ap.add_argument("--flavour", default="vllm")
    ap.add_argument("--seconds", type=float, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conc", type=_ints, default=[1, 64])
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--co-located", action="store_true", help="the coordinator's co-located front (no gateway)")
    install_uvloop()
    asyncio.run(main(ap.parse_args()))
