"""A/B of the gateway's DispatchMany stream, interleaved (not a test).

    .venv/bin/python bench/multiplex_ab.py [--flavour vllm|sglang] [--stream] [--rounds 3] [--seconds 2]
                                           [--variants mux,unary,co] [--conc 1,64]

Same engines throughout; per round each variant is started fresh and measured in turn (mux: the
default gateway + coordinator; unary: the gateway with ``multiplex: false``; co: the co-located
front), so a machine whose load drifts during the run biases no variant. Prints every
measurement and the medians: CPU microseconds per request of the Motor process tree, req/s, p50.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.ab import Results, measure, print_medians
from bench.common import ZERO, start_engines, start_motor

VARIANTS: dict[str, dict[str, Any]] = {"mux": dict(), "unary": dict(gateway_config={"multiplex": False}), "co": dict(co_located=True)}

async def main(a: argparse.Namespace) -> None:
    res: Results = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        async with start_engines(a.flavour, d, ZERO) as e:
            for rnd in range(a.rounds):
                for v in a.variants:
                    async with start_motor(e, d, name=v, **VARIANTS[v]) as t:
                        await measure(t, v, rnd, a.conc, a.stream, a.seconds, res)
    print_medians(res)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


if __name__ == "__main__":
    from motor_common.runner import install_uvloop

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flavour", default="vllm")
    ap.add_argument("--seconds", type=float, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", type=lambda s: s.split(","), default=["mux", "unary", "co"])
    ap.add_argument("--conc", type=_ints, default=[1, 64])
    ap.add_argument("--stream", action="store_true")
    install_uvloop()
    asyncio.run(main(ap.parse_args()))
