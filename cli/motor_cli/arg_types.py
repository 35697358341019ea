"""Argument types of the ``motor`` commands' numbers: a value out of range is argparse's usage
error (exit 2, naming the flag), never a traceback or a silently odd behaviour (NaN seconds:
a deadline that never comes; a port above 65535: OverflowError from bind)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

# Longest wait a flag accepts: past a day it is a typo (and gRPC fails at once from ~7e9 s).
MAX_SECONDS = 86_400.0


def seconds(minimum: float = 0.0, *, above: bool = True) -> Callable[[str], float]:
    """Seconds, finite, in (*minimum*, MAX_SECONDS] (*above*) or [*minimum*, MAX_SECONDS]."""
    low = f"more than {minimum:g}" if above else f"at least {minimum:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if (
            not math.isfinite(value)
            or value > MAX_SECONDS
            or (value <= minimum if above else value < minimum)
        ):
            raise argparse.ArgumentTypeError(
                f"{text} seconds: give {low} and at most {MAX_SECONDS:g}"
            )
        return value

    return parse


def port(text: str) -> int:
    """A TCP port, 0-65535 (0: pick a free one)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is outside 0-65535")
    return value
