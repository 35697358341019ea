"""bench/front_pieces.py still runs against this tree: every scratch patch finds the code it cuts,
the patched copies import, a short run serves every variant, and the in-process timings of the
tried cuts run (and restore logging). No benchmark figures."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from bench.front_pieces import (
    PACKAGES,
    PIECES,
    ROOT,
    _fast_request_id,
    bench,
    costs,
    micro,
    patched,
    scratch_tree,
    variants,
)

_IMPORTS = ("import motor_common.openai_front.app as a, motor_coordinator.http_front, "
            "motor_coordinator.dispatcher, motor_coordinator.dispatch_trace, motor_coordinator.main; "
            "print(a.__file__)")


@pytest.mark.parametrize("piece", [*PIECES, "all"])
def test_each_piece_patches_this_tree_and_the_copy_imports(tmp_path: Path, piece: str) -> None:
    pieces = list(PIECES) if piece == "all" else [piece]
    tree = scratch_tree(ROOT, tmp_path / piece, pieces)
    for p in pieces if piece != "all" else []:  # (in "all" two pieces patch one line)
        for path, old, new in PIECES[p]:
            text = (tree / path).read_text()
            assert new in text and (old not in text or old in new), (p, old)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(tree / p) for p in PACKAGES)}
    r = subprocess.run([sys.executable, "-c", _IMPORTS], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tree / "common/motor_common/openai_front/app.py")


def test_a_patch_whose_text_is_gone_names_its_piece() -> None:
    with pytest.raises(ValueError, match=r"piece 'x'.*occurs 0 times"):
        patched("nothing here", "x", [("f.py", "needle", "")], "f.py")
    assert patched("a needle", "x", [("f.py", "needle", "pin"), ("g.py", "a", "b")], "f.py") == "a pin"


def test_costs_are_per_round_differences_to_the_full_front() -> None:
    res = {("front", 1): [(1000.0, 1.0, 1.0), (1200.0, 1.0, 1.0)],
           ("-access_log", 1): [(900.0, 1.0, 1.0), (1000.0, 1.0, 1.0)]}
    text = costs(res, ["access_log"], [1])
    assert "-access_log" in text and "150 us/req" in text and "13.6% of front" in text and "[100 .. 200]" in text
    assert variants(["a", "b"]) == ["front", "front-b", "relay", "-a", "-b", "-all"]


@pytest.mark.slow
async def test_a_short_run_serves_every_variant() -> None:
    a = argparse.Namespace(pieces=["access_log"], rounds=1, seconds=0.5, conc=[2], stream=False)
    res = await bench(a)
    assert sorted(v for v, _ in res) == sorted(variants(["access_log"]))
    assert all(x[0][1] > 0 and x[0][0] > 0 for x in res.values()), res  # each served and used CPU


def test_micro_times_every_tried_cut_and_leaves_logging_as_it_found_it() -> None:
    flags = (logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing)
    handlers = logging.getLogger().handlers[:]
    try:
        out = micro(200, 1)
    finally:
        logging.getLogger().handlers[:] = handlers
    assert set(out) == {"access-log line (json)", "access-log line (text)", "request id",
                        "load guard (x2 per PD request)"}
    assert all(before > 0 and after > 0 for before, after in out.values())
    assert (logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing) == flags
    rid = _fast_request_id()
    assert uuid.UUID(rid).hex == rid and uuid.UUID(rid).version == 4 and uuid.UUID(rid).variant == uuid.RFC_4122
