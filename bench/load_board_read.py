"""What reading the front workers' shared-memory load board costs, in process (not a test).

    .venv/bin/python bench/load_board_read.py [--rows 2,4,8,16] [--endpoints 2,100,1000]

A front worker (``http.workers`` > 1) sums the other workers' rows of the board
(``motor_coordinator.load_board.LoadBoard.others``) before it routes, at most once per millisecond.
This times that read for N rows (N-1 summed) and E endpoints, each read after a peer's write so
the sum is rebuilt (the dear case), and a worker's write of one endpoint's load.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from motor_coordinator.load_board import LoadBoard


def time_board(rows: int, endpoints: int, reps: int) -> tuple[float, float]:
    """(µs per read, µs per write) for *rows* rows and *endpoints* endpoints."""
    with tempfile.TemporaryDirectory(prefix="motor-board-") as tmp:
        path = str(Path(tmp) / "board")
        LoadBoard.create(path, rows).close()
        keys = [(f"10.0.{i // 250}.1", 8000 + i % 250) for i in range(endpoints)]
        boards = [LoadBoard(path, rows, i) for i in range(rows)]
        try:
            for b in boards:
                b.set_endpoints(keys)
            t0 = time.perf_counter()
            for k in range(reps):
                boards[1].write(keys[k % endpoints], k + 1, k + 1)
                boards[0].others(force=True)
            read = (time.perf_counter() - t0) / reps
            t0 = time.perf_counter()
            for k in range(reps):
                boards[0].write(keys[k % endpoints], k, k)
            write = (time.perf_counter() - t0) / reps
        finally:
            for b in boards:
                b.close()
    return read * 1e6, write * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="2,4,8,16", help="front workers N (rows on the board)")
    ap.add_argument("--endpoints", default="2,100,1000", help="engine endpoints in the instance set")
    args = ap.parse_args()
    for rows in (int(x) for x in args.rows.split(",")):
        for endpoints in (int(x) for x in args.endpoints.split(",")):
            read, write = time_board(rows, endpoints, 2000 if endpoints < 1000 else 300)
            print(f"N={rows:2d} endpoints={endpoints:5d}  read (sum of {rows - 1} rows) {read:8.1f} µs"
                  f"   write {write:5.2f} µs")


if __name__ == "__main__":
    main()
