"""``scheduler.kv_events.tokenizer: hf``: a real Hugging Face tokenizer (a byte-level BPE trained at
test time, BOS added by its post-processor) and chat templates rendered as transformers renders them
for vLLM. No sockets, no network. The proof against a real engine is
tests/realengine/test_kv_events_real_vllm.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from motor_common.config import load_config
from motor_common.errors import ConfigError
from motor_coordinator.app import Coordinator
from motor_coordinator.config import CoordinatorConfig, KvEventsConfig, SchedulerConfig
from motor_coordinator.hf_tokenizer import HfTokenizer
from motor_coordinator.hf_tokenizer_loader import load_hf_tokenizer, load_hf_tokenizers
from motor_coordinator.prompt_tokens import PromptTokens, prompt_token_ids
from motor_coordinator.request import CHAT, COMPLETIONS, parsed_request
from tests.conftest import tool

tokenizers = pytest.importorskip("tokenizers")  # the dev extra has it; CI installs it

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role ' + m['role']) }}{% endif %}"
    "<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
TEXT = ("The quick brown fox jumps over the lazy dog. Motor routes prefill and decode requests. "
        "Hello world, how are you today? <b>bold</b> & \"quoted\" text. 0 1 2 3 4 5 6 7 8 9.\n") * 8


def make_tokenizer(directory: Path, *, template: Any = TEMPLATE, jinja_file: str | None = None) -> Path:
    """A byte-level BPE tokenizer.json (BOS by its post-processor) + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TEXT.splitlines(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    cfg: dict[str, Any] = {"bos_token": "<s>", "eos_token": {"content": "</s>", "special": True},
                           "unk_token": "<unk>", "pad_token": "<pad>"}
    if template is not None:
        cfg["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(cfg))
    if jinja_file is not None:
        (directory / "chat_template.jinja").write_text(jinja_file)
    return directory


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("hf") / "model")


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> HfTokenizer:
    return load_hf_tokenizer(str(model_dir))


def raw(model_dir: Path) -> Any:
    return tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def chat(body: dict[str, Any], hf: HfTokenizer, limit: int = 4096) -> tuple[int, ...] | None:
    return prompt_token_ids(parsed_request(CHAT, {"model": "m", **body}), "hf", limit, hf)


MESSAGES = [{"role": "system", "content": "You are a quick fox."}, {"role": "user", "content": "Hello world"}]


def test_chat_renders_the_template_with_special_tokens_and_encodes_without_adding_any(
        model_dir: Path, hf: HfTokenizer) -> None:
    expected = "<s><|system|>\nYou are a quick fox.</s>\n<|user|>\nHello world</s>\n<|assistant|>\n"
    assert hf.render_chat({"messages": MESSAGES}) == expected
    want = raw(model_dir).encode(expected, add_special_tokens=False).ids
    assert want[0] == 1 and want.count(1) == 1  # the template's <s>, not the post-processor's
    assert chat({"messages": MESSAGES}, hf) == tuple(want)
    # the request may ask vLLM for special tokens on top: the post-processor's <s> comes first
    assert chat({"messages": MESSAGES, "add_special_tokens": True}, hf) == (1, *want)
    no_gen = chat({"messages": MESSAGES, "add_generation_prompt": False}, hf)
    assert no_gen == tuple(raw(model_dir).encode(expected[: -len("<|assistant|>\n")], add_special_tokens=False).ids)


def test_continue_final_message_leaves_the_last_message_open(model_dir: Path, hf: HfTokenizer) -> None:
    body = {"messages": [*MESSAGES, {"role": "assistant", "content": "The quick"}],
            "add_generation_prompt": False, "continue_final_message": True}
    text = hf.render_chat(body)
    assert text.endswith("<|assistant|>\nThe quick")
    assert chat(body, hf) == tuple(raw(model_dir).encode(text, add_special_tokens=False).ids)
    # vLLM refuses both flags at once: no opinion
    assert chat({**body, "add_generation_prompt": True}, hf) is None


def test_text_parts_are_joined_by_newlines_for_a_string_template(hf: HfTokenizer) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]}]
    assert hf.content_format == "string"
    assert chat({"messages": parts}, hf) == chat({"messages": [{"role": "user", "content": "Hello\nworld"}]}, hf)


def test_a_template_that_loops_over_content_gets_parts_and_tojson_does_not_escape_html(tmp_path: Path) -> None:
    tpl = ("{% for m in messages %}[{{ m.role }}]{% for p in m.content %}{{ p.text | tojson }}{% endfor %}"
           "{% endfor %}")
    hf = load_hf_tokenizer(str(make_tokenizer(tmp_path / "m", template=tpl)))
    assert hf.content_format == "openai"
    text = hf.render_chat({"messages": [{"role": "user", "content": "<b>bold</b> & \"quoted\""}],
                           "add_generation_prompt": False})
    assert text == '[user]"<b>bold</b> & \\"quoted\\""'


def test_completion_text_gets_the_post_processors_special_tokens_unless_asked_not_to(
        model_dir: Path, hf: HfTokenizer) -> None:
    tok = raw(model_dir)
    req = parsed_request(COMPLETIONS, {"model": "m", "prompt": "Hello world"})
    assert prompt_token_ids(req, "hf", 100, hf) == tuple(tok.encode("Hello world").ids)
    assert prompt_token_ids(req, "hf", 100, hf)[0] == 1  # type: ignore[index]
    off = parsed_request(COMPLETIONS, {"model": "m", "prompt": ["Hello world", "x"], "add_special_tokens": False})
    assert prompt_token_ids(off, "hf", 100, hf) == tuple(tok.encode("Hello world", add_special_tokens=False).ids)
    ids = parsed_request(COMPLETIONS, {"model": "m", "prompt": [5, 6, 7]})
    assert prompt_token_ids(ids, "hf", 100, hf) == (5, 6, 7)  # ids are used as they are


def test_a_long_prompt_is_encoded_only_as_far_as_the_limit_needs(model_dir: Path, hf: HfTokenizer) -> None:
    long = TEXT * 40  # ~60k characters
    full = raw(model_dir).encode(long).ids
    seen: list[int] = []

    class Spy:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def encode(self, text: str, add_special_tokens: bool = True) -> Any:
            seen.append(len(text))
            return self.inner.encode(text, add_special_tokens=add_special_tokens)

    spy = HfTokenizer(Spy(raw(model_dir)), TEMPLATE, hf.special)
    for limit in (1, 50, 333, 2000):
        seen.clear()
        assert spy.encode(long, True, limit) == tuple(full[:limit])
        assert max(seen) < len(long) and sum(seen) <= 3 * (limit * 6 + 256) * 2
    assert spy.encode("Hello", True, 50) == tuple(raw(model_dir).encode("Hello").ids)


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "tool", "content": "x"}]},  # the template raises
        {"messages": [{"role": "developer", "content": "x"}]},  # vLLM rewrites it
        {"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        {"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}]},
        {"messages": MESSAGES, "chat_template": "{{ 1 }}"},
        {"messages": MESSAGES, "truncate_prompt_tokens": 5},
        {"messages": MESSAGES, "chat_template_kwargs": {"tokenize": False}},
        {"messages": [{"content": "no role"}]},
        {"messages": MESSAGES, "add_special_tokens": "yes"},
    ],
)
def test_requests_it_cannot_reproduce_get_no_ids(hf: HfTokenizer, body: dict[str, Any]) -> None:
    assert chat(body, hf) is None


def test_template_kwargs_and_reasoning_effort_reach_the_template(tmp_path: Path) -> None:
    tpl = "{{ flavour }}|{{ enable_thinking }}|{{ reasoning_effort }}|{{ messages[0].content }}"
    hf = load_hf_tokenizer(str(make_tokenizer(tmp_path / "m", template=tpl)))
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"flavour": "fox"},
            "reasoning_effort": "low"}
    assert hf.render_chat(body) == "fox|True|low|hi"


def test_where_the_chat_template_comes_from(tmp_path: Path) -> None:
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ messages[0].content }}"}]
    body = {"messages": [{"role": "user", "content": "x"}]}
    assert load_hf_tokenizer(str(make_tokenizer(tmp_path / "a", template=named))).render_chat(body) == "Dx"
    d = make_tokenizer(tmp_path / "b", jinja_file="J{{ messages[0].content }}")  # the file wins
    assert load_hf_tokenizer(str(d)).render_chat(body) == "Jx"
    assert load_hf_tokenizer(str(d / "tokenizer.json")).render_chat(body) == "Jx"  # the file path form
    bare = load_hf_tokenizer(str(make_tokenizer(tmp_path / "c", template=None)))
    assert chat(body, bare) is None  # no template: the engine refuses chat; no opinion
    req = parsed_request(COMPLETIONS, {"model": "m", "prompt": "Hello"})
    assert prompt_token_ids(req, "hf", 10, bare) is not None


def test_load_errors_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tokenizer_path: .*does not exist"):
        load_hf_tokenizer(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"tokenizer_path: no tokenizer.json"):
        load_hf_tokenizer(str(tmp_path / "empty"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"tokenizer_path: cannot load .*tokenizer.json"):
        load_hf_tokenizer(str(bad))
    broken = make_tokenizer(tmp_path / "broken", template="{% for %}")
    with pytest.raises(ConfigError, match=r"tokenizer_path: the chat template .* does not compile"):
        load_hf_tokenizer(str(broken))
    cfg = make_tokenizer(tmp_path / "cfg")
    (cfg / "tokenizer_config.json").write_text("[1]")
    with pytest.raises(ConfigError, match=r"tokenizer_path: .*must hold a JSON object"):
        load_hf_tokenizer(str(cfg))


def test_the_keys_are_validated(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    for text, what in (("scheduler: {kv_events: {tokenizer: hf}}", "tokenizer_path must name"),
                       ("scheduler: {kv_events: {tokenizer_path: /x}}", "only used with tokenizer 'hf'"),
                       ("scheduler: {kv_events: {tokenizer_paths: {m: /x}}}", "only used with tokenizer 'hf'"),
                       ("scheduler: {kv_events: {tokenizer: hf, tokenizer_paths: {m: ''}}}", "maps a model name"),
                       ("scheduler: {kv_events: {tokenizer: hf, tokenizer_paths: [/x]}}", "tokenizer_paths")):
        p.write_text(text)
        with pytest.raises(ConfigError, match=what):
            load_config(CoordinatorConfig, str(p), env_prefix="MOTOR_COORDINATOR")


def test_each_listed_model_gets_its_own_tokenizer_and_the_others_the_default_or_none(
    tmp_path: Path, model_dir: Path
) -> None:
    other = make_tokenizer(tmp_path / "other", template=(
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"))
    mine, theirs = load_hf_tokenizer(str(model_dir)), load_hf_tokenizer(str(other))
    body = {"messages": MESSAGES}
    want = {"a": mine.chat_ids(body, 64), "b": theirs.chat_ids(body, 64)}
    assert want["a"] and want["b"] and want["a"] != want["b"]

    def ids(tokens: PromptTokens, model: str) -> tuple[int, ...] | None:
        return tokens(parsed_request(CHAT, {"model": model, **body}))

    default, models = load_hf_tokenizers("", {"a": str(model_dir), "b": str(other)})
    per_model = PromptTokens("hf", 64, hf=default, hf_models=models)
    assert default is None and (ids(per_model, "a"), ids(per_model, "b")) == (want["a"], want["b"])
    assert ids(per_model, "c") is None  # neither listed nor a default: the ring decides
    default, models = load_hf_tokenizers(str(model_dir), {"b": str(other)})
    with_default = PromptTokens("hf", 64, hf=default, hf_models=models)
    assert [ids(with_default, m) for m in ("a", "b", "c")] == [want["a"], want["b"], want["a"]]
    with pytest.raises(ConfigError, match=r"scheduler\.kv_events\.tokenizer_paths\.b: .*does not exist"):
        load_hf_tokenizers(str(model_dir), {"b": str(tmp_path / "nope")})


async def test_the_coordinator_loads_it_for_kv_events(model_dir: Path) -> None:
    kv = KvEventsConfig(tokenizer="hf", tokenizer_path=str(model_dir), max_prompt_tokens=7)
    app = Coordinator(CoordinatorConfig(scheduler=SchedulerConfig(policy="kv_events", kv_events=kv)))
    try:
        assert app.dispatcher.token_ids is not None
        ids = app.dispatcher.token_ids(parsed_request(CHAT, {"model": "m", "messages": MESSAGES}))
        assert ids == tuple(raw(model_dir).encode(load_hf_tokenizer(str(model_dir)).render_chat(
            {"messages": MESSAGES}), add_special_tokens=False).ids[:7])
    finally:
        await app.kv_events.close() if app.kv_events else None
    with pytest.raises(ValueError, match="HfTokenizer"):
        PromptTokens("hf", 10)


async def test_the_coordinator_loads_the_per_model_tokenizers(model_dir: Path) -> None:
    kv = KvEventsConfig(tokenizer="hf", tokenizer_paths={"m": str(model_dir)}, max_prompt_tokens=7)
    app = Coordinator(CoordinatorConfig(scheduler=SchedulerConfig(policy="kv_events", kv_events=kv)))
    try:
        assert app.dispatcher.token_ids is not None
        listed = app.dispatcher.token_ids(parsed_request(CHAT, {"model": "m", "messages": MESSAGES}))
        assert listed == load_hf_tokenizer(str(model_dir)).chat_ids({"messages": MESSAGES}, 7)
        assert app.dispatcher.token_ids(parsed_request(CHAT, {"model": "other", "messages": MESSAGES})) is None
    finally:
        await app.kv_events.close() if app.kv_events else None


def _run_coordinator(tmp_path: Path, tokenizer_path: str, pythonpath: str | None = None,
                     *flags: str) -> Any:
    import os

    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"scheduler": {"policy": "kv_events",
                                             "kv_events": {"tokenizer": "hf", "tokenizer_path": tokenizer_path}}}))
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([tool("motor-coordinator"), "--config", str(cfg), "--port", "0", *flags],
                          capture_output=True, text=True, timeout=60, env=env)


def test_the_coordinator_exits_2_without_the_extra(tmp_path: Path, model_dir: Path) -> None:
    shadow = tmp_path / "shadow" / "tokenizers"
    shadow.mkdir(parents=True)  # an import of tokenizers fails as if it were not installed
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'tokenizers'\", name='tokenizers')\n")
    out = _run_coordinator(tmp_path, str(model_dir), str(shadow.parent))
    assert out.returncode == 2, out.stderr
    assert "motor-pd[tokenizers]" in out.stderr and "scheduler.kv_events.tokenizer" in out.stderr


def test_the_coordinator_exits_2_naming_the_key_on_a_bad_path(tmp_path: Path) -> None:
    for flags in ((), ("--check-config",)):
        out = _run_coordinator(tmp_path, str(tmp_path / "missing"), None, *flags)
        assert out.returncode == 2, out.stderr
        assert "scheduler.kv_events.tokenizer_path" in out.stderr and "does not exist" in out.stderr


def test_check_config_loads_the_tokenizer(tmp_path: Path, model_dir: Path) -> None:
    out = _run_coordinator(tmp_path, str(model_dir), None, "--check-config")
    assert out.returncode == 0 and "configuration OK" in out.stdout, out.stderr
    shadow = tmp_path / "shadow" / "tokenizers"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'tokenizers'\", name='tokenizers')\n")
    out = _run_coordinator(tmp_path, str(model_dir), str(shadow.parent), "--check-config")
    assert out.returncode == 2 and "motor-pd[tokenizers]" in out.stderr, out.stderr


def test_chat_text_is_encoded_piece_by_piece_between_added_tokens_exactly(model_dir: Path, hf: HfTokenizer) -> None:
    import random

    tok = raw(model_dir)
    assert hf.piecewise
    rnd = random.Random(7)
    words = ["<s>", "</s>", "<pad>", "<unk>", " ", "  ", "\n", "Hello", " world", "fox", "<", "s>", "</", "ü",
             "0 1 2", "\t", "lazy dog.", "<s><s>", " </s> "]
    for _ in range(300):
        text = "".join(rnd.choice(words) for _ in range(rnd.randrange(1, 30)))
        assert hf.encode(text, False, 4096) == tuple(tok.encode(text, add_special_tokens=False).ids), repr(text)
    # a repeated piece comes from the cache (a spy counts what reaches the library)
    seen: list[str] = []

    class Spy:
        def encode(self, text: str, add_special_tokens: bool = True) -> Any:
            seen.append(text)
            return tok.encode(text, add_special_tokens=add_special_tokens)

    spy = HfTokenizer(Spy(), TEMPLATE, hf.special, {"<s>": 1, "</s>": 2, "<pad>": 3, "<unk>": 0})
    first = [*MESSAGES, {"role": "assistant", "content": "Hi."}]
    spy.encode(spy.render_chat({"messages": first}), False, 4096)
    seen.clear()
    text = spy.render_chat({"messages": [*first, {"role": "user", "content": "The quick brown fox"}]})
    assert spy.encode(text, False, 4096) == tuple(tok.encode(text, add_special_tokens=False).ids)
    assert seen == ["\n<|user|>\nThe quick brown fox"]  # only the new message's piece was encoded
    assert spy.encode(text, False, 5) == tuple(tok.encode(text, add_special_tokens=False).ids[:5])


def test_piecewise_only_where_the_library_encodes_pieces_independently(model_dir: Path) -> None:
    from motor_coordinator.hf_encoder import piecewise_added_tokens

    spec = json.loads((model_dir / "tokenizer.json").read_text())
    assert piecewise_added_tokens(spec) == {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
    first = {**spec, "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"}}
    assert piecewise_added_tokens(first) is None  # only the first piece gets the prefix
    seq = {**spec, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [first["pre_tokenizer"]]}}
    assert piecewise_added_tokens(seq) is None
    lstrip = {**spec, "added_tokens": [{**spec["added_tokens"][0], "lstrip": True}]}
    assert piecewise_added_tokens(lstrip) is None  # the token eats the spaces before it
    normalized = {**spec, "normalizer": {"type": "NFC"},
                  "added_tokens": [{**spec["added_tokens"][0], "normalized": True}]}
    assert piecewise_added_tokens(normalized) is None


# (template, vLLM's auto content format); tests/realengine checks these against vLLM's own function
CONTENT_FORMATS = [
    ("{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}", "openai"),
    ("{% for m in messages %}{{ m.content }}{% endfor %}", "string"),
    ("{% for t in tools %}{% for x in t.content %}{{ x }}{% endfor %}{% endfor %}"
     "{% for m in messages %}{{ m.content }}{% endfor %}", "string"),
    ("{% set msgs = messages[1:] %}{% for m in msgs %}{% for p in m.content %}{{ p.text }}{% endfor %}"
     "{% endfor %}", "openai"),
    ("{% macro show(c) %}{% for p in c %}{{ p.text }}{% endfor %}{% endmacro %}"
     "{% for m in messages %}{{ show(m.content) }}{% endfor %}", "openai"),
    ("{% macro show(c) %}{% for p in c %}{{ p }}{% endfor %}{% endmacro %}"
     "{% for m in messages %}{{ show(m.role) }}{% endfor %}", "string"),
    ("{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}"
     "{% for p in m.content | list %}{{ p.text }}{% endfor %}{% endif %}{% endfor %}", "openai"),
    ("{% set content = messages[0].content %}{% for x in content %}{{ x }}{% endfor %}", "openai"),
    ("{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}", "string"),
]


@pytest.mark.parametrize(("template", "fmt"), CONTENT_FORMATS)
def test_content_format_detection_follows_vllms_rules(hf: HfTokenizer, template: str, fmt: str) -> None:
    assert HfTokenizer(hf._tok, template, {}).content_format == fmt


def test_a_claude_code_attribution_line_in_the_system_prompt_is_dropped_as_vllm_does(hf: HfTokenizer) -> None:
    def system(content: Any) -> str:
        return hf.render_chat({"messages": [{"role": "system", "content": content}], "add_generation_prompt": False})

    assert system("x-anthropic-billing-header: cch=1\nBe brief.") == system("Be brief.")
    assert system([{"type": "text", "text": "x-anthropic-billing-header: cch=2"},
                   {"type": "text", "text": "Be brief."}]) == system("Be brief.")
    assert system("Be brief.\nx-anthropic-billing-header") != system("Be brief.")  # only at the start


def test_continue_final_message_with_content_parts(tmp_path: Path) -> None:
    tpl = ("{% for m in messages %}<{{ m.role }}>{% for p in m.content %}{{ p.text }}{% endfor %}</{{ m.role }}>"
           "{% endfor %}")
    hf = load_hf_tokenizer(str(make_tokenizer(tmp_path / "m", template=tpl)))
    body = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Once upon"}],
            "add_generation_prompt": False, "continue_final_message": True}
    assert hf.render_chat(body) == "<user>Hi</user><assistant>Once upon"
    empty = {**body, "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None}]}
    assert chat(empty, hf) is None  # nothing to continue: transformers refuses it
