"""The real vLLM CPU engine's KV-event stream against Motor's index: the block hashes Motor
predicts for a prompt (``vllm_block_hashes``: sha256, default seed, block size 32) are the ones the
engine reports, decoded by Motor's decoder, caught up through its replay socket and followed live.

Token-id prompts, and (``tokenizer: hf``) a chat and a text completion prompt: the ids the
coordinator computes from the model's own tokenizer files equal the engine's (its /tokenize
answers), and the engine stores exactly the blocks the index predicts for them. The model is the
lane's tiny Llama with a BOS-adding post-processor and a richer chat template (special tokens,
a loop over content parts, raise_exception), so both encodings and vLLM's content format matter.

Needs ``scripts/real-engine-setup``; skips only when the venv is absent.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from motor_common.kv_events import Flavour, vllm_event_hashes
from motor_coordinator.hf_tokenizer import HfTokenizer
from motor_coordinator.hf_tokenizer_loader import load_hf_tokenizer
from motor_coordinator.kv_index import KvIndex
from motor_coordinator.kv_subscriber import EventSource, KvEventSubscriber
from motor_coordinator.prompt_tokens import PromptTokens
from motor_coordinator.request import CHAT, COMPLETIONS, parsed_request
from tests.helpers import free_port, wait_for
from tests.realengine.test_vllm_vs_simulator import (
    LIMITS,
    MODEL_DIR,
    NAME,
    REAL_VLLM,
    VENV,
    _spawn,
    _stop,
    _wait_healthy,
    lane,
)

pytestmark = lane(900)

BS = 32  # vLLM's CPU attention backend needs a multiple of 32 (16 fails at start-up)
FIRST = list(range(100, 180))  # 80 tokens: 2 full blocks
SECOND = [*FIRST[:BS], *range(300, 348)]  # shares FIRST's first block (the tiny model: 512 ids)


# A template that exercises what apply_chat_template does: special tokens from
# tokenizer_config.json, trim_blocks/lstrip_blocks, raise_exception, a loop over content parts
# (vLLM then passes string content as [{"type": "text", ...}]).
TEMPLATE = """{{ bos_token }}
{% for m in messages %}
  {% if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('unknown role') }}{% endif %}
<|{{ m['role'] }}|>
  {% for part in m['content'] %}{{ part['text'] }}{% if not loop.last %} {% endif %}{% endfor %}
{{ eos_token }}
{% endfor %}
{% if add_generation_prompt %}<|assistant|>
{% endif %}"""
CHAT_BODY = {"messages": [
    {"role": "system", "content": "You are a helpful assistant. The coordinator routes each request to a "
                                  "prefill engine and then to a decode engine."},
    {"role": "user", "content": [{"type": "text", "text": "Tell me a story"},
                                 {"type": "text", "text": "about a robot."}]},
]}
ODD_CHATS = [
    # vLLM drops Claude Code's attribution line from system prompts
    {"messages": [{"role": "system", "content": "x-anthropic-billing-header: cch=abc\nBe brief."},
                  {"role": "user", "content": "Hello world"}]},
    # an assistant turn left open; the request asks for special tokens on top of the template's
    {"messages": [{"role": "user", "content": "Hello world"}, {"role": "assistant", "content": "Once upon"}],
     "add_generation_prompt": False, "continue_final_message": True},
    {"messages": [{"role": "user", "content": "Hello world"}], "add_special_tokens": True},
    {"messages": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": None},
                  {"role": "user", "content": "world"}], "add_generation_prompt": False},
]
TEXT = ("Once upon a time there was a small engine that answered every question with random words. "
        "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
        "The controller registers nodes, assembles instances and keeps the fleet healthy.")


def tokenizer_model(tmp: Path) -> Path:
    """The lane's tiny model with BOS added by its tokenizer.json and TEMPLATE as chat template."""
    from tokenizers import Tokenizer, processors

    out = tmp / "model"
    shutil.copytree(MODEL_DIR, out)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                       special_tokens=[("<s>", bos)])
    tok.save(str(out / "tokenizer.json"))
    (out / "chat_template.jinja").write_text(TEMPLATE)
    return out


async def post(url: str, path: str, body: dict[str, Any]) -> Any:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s, \
            s.post(url + path, json={"model": NAME, **body}) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def complete(url: str, prompt: list[int] | str) -> None:
    await post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 1})


async def test_real_vllm_reports_the_block_hashes_motor_predicts() -> None:
    pub, rep = free_port(), free_port()
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{pub}",
           "replay_endpoint": f"tcp://*:{rep}", "topic": "kv-events"}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}  # the default seed
    with tempfile.TemporaryDirectory(prefix="realengine-kv-") as tmp:
        model = tokenizer_model(Path(tmp))
        t0 = time.monotonic()
        real = _spawn("vllm", [str(REAL_VLLM), "serve", str(model), "--served-model-name", NAME,
                               *LIMITS, "--block-size", str(BS), "--enable-prefix-caching",
                               "--kv-events-config", json.dumps(cfg)], Path(tmp), env)
        index = KvIndex()
        sub = KvEventSubscriber(index, replay_timeout_s=5.0)
        try:
            _wait_healthy(real, t0, 600)
            await complete(real.url, FIRST)  # before anyone listens: the replay has it
            sub.set_sources([EventSource("real", NAME, Flavour.VLLM, f"tcp://127.0.0.1:{pub}",
                                         f"tcp://127.0.0.1:{rep}", "kv-events")])
            hf = vllm_event_hashes(FIRST, BS)
            await wait_for(lambda: index.prefix_lengths(NAME, hf, ["real"])["real"] == 2,
                           timeout=30, what="FIRST's two blocks, as Motor hashes them")
            await complete(real.url, SECOND)  # live: one new block after the shared one
            hs = vllm_event_hashes(SECOND, BS)
            assert hs[0] == hf[0]
            await wait_for(lambda: index.prefix_lengths(NAME, hs, ["real"])["real"] == 2,
                           timeout=30, what="SECOND's blocks, live")
            assert not index.is_stale("real")

            # tokenizer: hf - the coordinator's ids are the engine's, and so are the blocks
            token_ids = PromptTokens("hf", 8192, hf=load_hf_tokenizer(str(model)))
            chat_ids = token_ids(parsed_request(CHAT, {"model": NAME, **CHAT_BODY}))
            text_ids = token_ids(parsed_request(COMPLETIONS, {"model": NAME, "prompt": TEXT}))
            assert chat_ids is not None and text_ids is not None
            engine_chat = (await post(real.url, "/tokenize", {**CHAT_BODY, "add_generation_prompt": True}))["tokens"]
            engine_text = (await post(real.url, "/tokenize", {"prompt": TEXT}))["tokens"]
            assert list(chat_ids) == engine_chat
            assert list(text_ids) == engine_text
            for body in ODD_CHATS:  # each as vLLM renders it
                ours = token_ids(parsed_request(CHAT, {"model": NAME, **body}))
                assert ours is not None
                theirs = (await post(real.url, "/tokenize", body))["tokens"]
                assert list(ours) == theirs, body
            bos = 1
            assert chat_ids.count(bos) == 1 and chat_ids[0] == bos  # the template's, not added again
            assert text_ids[0] == bos  # completions text: the post-processor's
            assert len(chat_ids) >= 2 * BS and len(text_ids) >= 2 * BS, (len(chat_ids), len(text_ids))
            await post(real.url, "/v1/chat/completions", {**CHAT_BODY, "max_tokens": 1})
            await complete(real.url, TEXT)
            for ids in (chat_ids, text_ids):
                predicted = vllm_event_hashes(list(ids), BS)
                await wait_for(lambda p=predicted: index.prefix_lengths(NAME, p, ["real"])["real"] == len(p),
                               timeout=30, what="the hf prompt's blocks, as the coordinator hashes them")
            await routes_by_events(Path(tmp), model, real.url, pub, rep)
        finally:
            await sub.close()
            _stop(real)


async def routes_by_events(tmp: Path, model: Path, engine_url: str, pub: int, rep: int) -> None:
    """End to end: a motor-coordinator (co-located front, kv_events, tokenizer hf) with the engine
    registered as a union instance follows its events and routes the already-served chat as a
    held prefix - with no ids (tokenizer none) it could only fall back to the ring."""
    from prometheus_client.parser import text_string_to_metric_families

    from motor_cli.main import main as motor
    from tests.procs import start_coordinator

    key = "tok5-realengine-key"
    cfg = {"scheduler": {"policy": "kv_events",
                         "kv_events": {"tokenizer": "hf", "tokenizer_path": str(model), "block_size": BS}},
           "http": {"port": 0}, "server": {"metrics_port": 0}}
    async with start_coordinator(tmp / "coordinator", cfg, management_key=key) as coord:
        url = f"http://127.0.0.1:{coord.ports['http']}"
        metrics = f"http://127.0.0.1:{coord.ports['metrics']}/metrics"

        async def metric(name: str) -> dict[str, float]:
            async with aiohttp.ClientSession() as s, s.get(metrics) as r:
                text = await r.text()
            return {",".join(f"{k}={v}" for k, v in sorted(x.labels.items())): x.value
                    for fam in text_string_to_metric_families(text) for x in fam.samples if x.name == name}

        host, port = engine_url.removeprefix("http://").rsplit(":", 1)
        assert await asyncio.to_thread(motor, ["register", "add", "--coordinator", coord.address, "--management-key-file",
                      str(tmp / "coordinator" / "coordinator.key"), "--role", "union", "--model", NAME,
                      "--engine", "vllm", "--no-health-check",
                      "--endpoint", f"{host}:{port},kv_events={pub},kv_events_replay={rep}"]) == 0

        async def caught_up() -> bool:
            blocks = await metric("motor_coordinator_kv_index_blocks")
            stale = await metric("motor_coordinator_kv_index_stale")
            return bool(blocks) and min(blocks.values()) >= 4 and not any(stale.values())

        try:
            await wait_for(caught_up, timeout=60, what="the coordinator's index caught up with the engine")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: blocks {await metric('motor_coordinator_kv_index_blocks')}, stale "
                                 f"{await metric('motor_coordinator_kv_index_stale')}\n{coord.log()}") from exc
        before = await metric("motor_coordinator_kv_events_decisions_total")
        await post(url, "/v1/chat/completions", {**CHAT_BODY, "max_tokens": 1})
        after = await metric("motor_coordinator_kv_events_decisions_total")
        gained = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        assert gained.get("decision=prefix") == 1, gained


# --- the renderer against transformers' own apply_chat_template (the real venv's) ---------------
TEMPLATES = {
    "chatml": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
              " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
              "{% endif %}",
    "llama2": "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
              "(loop.index0 % 2 == 0) %}{{ raise_exception('roles must alternate') }}{% endif %}"
              "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] | trim + ' [/INST]' }}"
              "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] | trim + ' ' + eos_token }}"
              "{% endif %}{% endfor %}",
    "generation": "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}"
                  "{{ m.content }}{{ eos_token }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n"
                  "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
    "ns": "{%- set ns = namespace(sys='') -%}\n{%- for m in messages -%}\n  {%- if m.role == 'system' -%}"
          "{%- set ns.sys = m.content -%}{%- endif -%}\n{%- endfor -%}\n{{ bos_token }}{{ ns.sys | tojson }}\n"
          "{% for m in messages if m.role != 'system' %}\n    <{{ m.role }}>{{ m.content }}</{{ m.role }}>\n"
          "{% endfor %}\n{% if add_generation_prompt %}<assistant>{% endif %}",
}
CONVERSATION = [{"role": "system", "content": "You are a <b>helpful</b> assistant. \"Quoted\" & ünïcode."},
                {"role": "user", "content": "  Hello world!  "},
                {"role": "assistant", "content": "Hi. How are you today?"},
                {"role": "user", "content": "Tell me a story about a robot."}]
CASES = [
    {"messages": CONVERSATION},
    {"messages": CONVERSATION[1:]},
    {"messages": CONVERSATION, "add_generation_prompt": False},
    {"messages": CONVERSATION[:3], "add_generation_prompt": False, "continue_final_message": True},
]
HF_SIDE = """
import json, sys
from transformers import AutoTokenizer
job = json.load(sys.stdin)
out = {}
for name, tpl in job["templates"].items():
    tok = AutoTokenizer.from_pretrained(job["model"])
    for i, case in enumerate(job["cases"]):
        try:
            ids = tok.apply_chat_template(case["messages"], chat_template=tpl, tokenize=True, return_dict=False,
                                          add_generation_prompt=case.get("add_generation_prompt", True),
                                          continue_final_message=case.get("continue_final_message", False))
        except Exception as exc:
            ids = None
        out[f"{name}/{i}"] = ids
print(json.dumps(out))
"""


def test_the_renderer_matches_transformers_apply_chat_template(tmp_path: Path) -> None:
    model = tokenizer_model(tmp_path)
    job = {"model": str(model), "templates": TEMPLATES, "cases": CASES}
    run = subprocess.run([str(VENV / "bin" / "python"), "-c", HF_SIDE], input=json.dumps(job),
                         capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    theirs = json.loads(run.stdout.strip().splitlines()[-1])
    errors = 0
    for name, tpl in TEMPLATES.items():
        (model / "chat_template.jinja").write_text(tpl)
        token_ids = PromptTokens("hf", 8192, hf=load_hf_tokenizer(str(model)))
        for i, case in enumerate(CASES):
            ours = token_ids(parsed_request(CHAT, {"model": NAME, **case}))
            want = theirs[f"{name}/{i}"]
            assert (list(ours) if ours is not None else None) == want, (name, i)
            errors += want is None
    # llama2 refuses a system message (raise_exception) in 3 cases: both sides give no ids
    assert errors == 3 and len(theirs) == len(TEMPLATES) * len(CASES)


VLLM_SIDE = """
import json, sys
from vllm.renderers.hf import _detect_content_format
print(json.dumps([_detect_content_format(t, default="string") for t in json.load(sys.stdin)]))
"""


def test_content_format_detection_matches_vllms() -> None:
    from tests.coordinator.test_hf_tokenizer import CONTENT_FORMATS

    templates = [t for t, _ in CONTENT_FORMATS] + [TEMPLATE, *TEMPLATES.values()]
    run = subprocess.run([str(VENV / "bin" / "python"), "-c", VLLM_SIDE], input=json.dumps(templates),
                         capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    theirs = json.loads(run.stdout.strip().splitlines()[-1])
    hf = load_hf_tokenizer(str(MODEL_DIR))
    ours = [HfTokenizer(hf._tok, t, {}).content_format for t in templates]
    assert ours == theirs
    assert theirs[: len(CONTENT_FORMATS)] == [f for _, f in CONTENT_FORMATS]
