"""Cost of ``scheduler.kv_events.tokenizer: hf`` per request, in process (docs/kv-events.md).

    .venv/bin/python bench/prompt_tokens.py [--requests 2000] [--vocab 32000]

What the coordinator does before choosing a prefill engine for a chat or text request: render the
chat template (jinja2) and encode the text with Hugging Face ``tokenizers`` (at most
``max_prompt_tokens`` ids). No real model's files are on this machine, so the tokenizer is a
byte-level BPE of ``--vocab`` entries trained at start on the repository's own docs and sources
(the encoder's cost grows with the text, far less with the vocabulary), and the template is
ChatML's (its ``<|im_start|>``/``<|im_end|>`` are added tokens, so each message is a piece of the
tokenizer's piece cache). Sizes: a typical multi-turn chat (a 1.5k-character system prompt and
five turns of 400) with nothing cached, with its history cached and a new turn (what a
conversation's next request costs), fully cached; a 4x, a 16x and a 64x longer chat (the last
cut at 8192 ids); a one-line text completion. The simulator tokenizer is timed on the typical chat for scale. CPU time (this process's)
is the figure to quote on a busy box; wall time includes waiting for a core.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from motor_coordinator.hf_tokenizer_loader import load_hf_tokenizer
from motor_coordinator.prompt_tokens import PromptTokens
from motor_coordinator.request import CHAT, COMPLETIONS, ParsedRequest, parsed_request

ROOT = Path(__file__).resolve().parents[1]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")


def corpus() -> list[str]:
    lines: list[str] = []
    for pattern in ("docs/*.md", "services/**/*.py", "common/**/*.py", "README.md"):
        for p in sorted(ROOT.glob(pattern)):
            lines += p.read_text(errors="replace").splitlines()
    return lines


def make_model(out: Path, vocab: int) -> None:
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(corpus(), trainer=trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "chat_template": CHATML}))


TEXT = " ".join(corpus())
TURN = TEXT[20000:20400]


def chat(scale: int) -> dict[str, Any]:
    text = TEXT
    system = text[:1500 * scale]
    turns = [text[5000 + i * 400 * scale: 5000 + (i + 1) * 400 * scale] for i in range(6)]
    roles = ["user", "assistant"] * 3
    return {"model": "m", "messages": [{"role": "system", "content": system},
                                       *({"role": r, "content": t} for r, t in zip(roles, turns, strict=True))][:-1]}


def timed(fn: PromptTokens, make: Callable[[int], ParsedRequest], n: int, cold: bool = False
          ) -> tuple[float, float, int]:
    """Median of 5 runs: wall and CPU (this process's) microseconds per request, and the ids.
    *make(i)* is the i-th request; *cold* empties the tokenizer's piece cache before each."""
    ids = fn(make(0))
    wall, cpu = [], []
    for run in range(5):
        reqs = [make(run * n + i + 1) for i in range(n)]
        t0, c0 = time.perf_counter(), time.process_time()
        for req in reqs:
            if cold and fn.hf is not None:
                fn.hf.clear_cache()
            fn(req)
        wall.append((time.perf_counter() - t0) / n * 1e6)
        cpu.append((time.process_time() - c0) / n * 1e6)
    return statistics.median(wall), statistics.median(cpu), len(ids or ())


def next_turn(i: int) -> ParsedRequest:
    """The typical chat plus a new user message never seen before (its history is cached)."""
    body = chat(1)
    body["messages"] = [*body["messages"], {"role": "user", "content": f"Question {i}: " + TURN}]
    return parsed_request(CHAT, body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--vocab", type=int, default=32000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tok-") as tmp:
        make_model(Path(tmp), args.vocab)
        hf = PromptTokens("hf", 8192, hf=load_hf_tokenizer(tmp))
    sim = PromptTokens("simulator", 8192)
    typical = parsed_request(CHAT, chat(1))
    x4, x16, x64 = (parsed_request(CHAT, chat(k)) for k in (4, 16, 64))
    line = parsed_request(COMPLETIONS, {"model": "m", "prompt": "Tell me a story about a robot."})
    n = args.requests
    rows: list[tuple[str, str, PromptTokens, Callable[[int], ParsedRequest], int, bool]] = [
        ("hf", "chat, typical, nothing cached", hf, lambda i: typical, n, True),
        ("hf", "chat, typical + a new 400-char turn (history cached)", hf, next_turn, n, False),
        ("hf", "chat, typical, all cached (a retry)", hf, lambda i: typical, n, False),
        ("hf", "chat, 4x, nothing cached", hf, lambda i: x4, n // 4, True),
        ("hf", "chat, 16x, nothing cached", hf, lambda i: x16, n // 16, True),
        ("hf", "chat, ~200k chars, nothing cached (cut at 8192 ids)", hf, lambda i: x64, n // 64, True),
        ("hf", "completion, one line", hf, lambda i: line, n, False),
        ("simulator", "chat, typical + a new turn (for scale)", sim, next_turn, n, False),
    ]
    chars = sum(len(m["content"]) for m in chat(1)["messages"])
    print(f"tokenizer: byte-level BPE, vocab {args.vocab}; typical chat = {chars} characters")
    print(f"{'tokenizer':10} {'prompt':55} {'ids':>6} {'cpu us':>9} {'wall us':>9}")
    for name, what, fn, make, k, cold in rows:
        wall, cpu, ids = timed(fn, make, max(k, 5), cold)
        print(f"{name:10} {what:55} {ids:6d} {cpu:9.1f} {wall:9.1f}")


if __name__ == "__main__":
    main()
