"""KV-event wire formats and block hashes, against figures produced by the real engines' code.

The golden bytes and hashes below were produced by vLLM 0.32's own classes
(``vllm.distributed.kv_events.KVEventBatch`` encoded with ``msgspec.msgpack``, and
``vllm.v1.core.kv_cache_utils.hash_block_tokens`` with ``sha256`` after ``init_none_hash``);
tests/realengine re-derives them from the installed vLLM when its venv is present.
"""

from __future__ import annotations

import hashlib
import struct

import msgspec
import pytest

from motor_common.kv_events import (
    END_SEQ,
    MAX_BATCH_HASHES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    Flavour,
    KVEventError,
    block_hashes,
    decode_batch,
    encode_batch,
    parse_seq,
    sglang_block_hashes,
    vllm_block_hashes,
    vllm_event_hashes,
    vllm_none_hash,
)

H = bytes(range(32))
VLLM_GOLDEN = bytes.fromhex(
    "93cb3ff80000000000009289a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391c42000"
    "0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fb1706172656e745f626c6f636b5f68"
    "617368c0a9746f6b656e5f69647393010203aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756d"
    "a3475055a96c6f72615f6e616d65c0a967726f75705f6964780084a474797065ac426c6f636b52656d6f766564ac"
    "626c6f636b5f68617368657391c420000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e"
    "1fa66d656469756da3475055a967726f75705f6964780000"
)


def test_vllm_encoding_is_byte_identical_to_vllm() -> None:
    batch = EventBatch(1.5, (BlockStored((H,), None, (1, 2, 3), 16), BlockRemoved((H,))), 0)
    assert encode_batch(Flavour.VLLM, batch) == VLLM_GOLDEN
    assert decode_batch(Flavour.VLLM, VLLM_GOLDEN) == batch


def test_vllm_batch_shape_map_tagged_events() -> None:
    batch = EventBatch(2.0, (BlockStored((H,), H, (7,), 16), AllBlocksCleared()), 1)
    raw = msgspec.msgpack.decode(encode_batch(Flavour.VLLM, batch))
    assert raw[0] == 2.0 and raw[2] == 1
    assert raw[1][0]["type"] == "BlockStored" and raw[1][0]["parent_block_hash"] == H
    assert raw[1][1] == {"type": "AllBlocksCleared"}


def test_sglang_batch_shape_array_tagged_events() -> None:
    batch = EventBatch(
        3.0, (BlockStored((5, -6), 4, (1, 2), 2), BlockRemoved((5,)), AllBlocksCleared())
    )
    payload = encode_batch(Flavour.SGLANG, batch)
    assert msgspec.msgpack.decode(payload) == [
        3.0,
        [["BlockStored", [5, -6], 4, [1, 2], 2, None], ["BlockRemoved", [5]], ["AllBlocksCleared"]],
    ]
    assert decode_batch(Flavour.SGLANG, payload) == batch


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",
        msgspec.msgpack.encode([1.0, [{"type": "Nope"}], 0]),
        msgspec.msgpack.encode({"ts": 1}),
    ],
)
def test_garbage_is_a_clear_error(payload: bytes) -> None:
    with pytest.raises(KVEventError, match="not a vllm KV event batch"):
        decode_batch(Flavour.VLLM, payload)


def test_flavours_do_not_cross_decode() -> None:
    v = encode_batch(Flavour.VLLM, EventBatch(1.0, (BlockRemoved((H,)),), 0))
    with pytest.raises(KVEventError):
        decode_batch(Flavour.SGLANG, v)


def test_seq_frames() -> None:
    assert parse_seq(END_SEQ) == -1
    assert parse_seq((5).to_bytes(8, "big")) == 5
    with pytest.raises(KVEventError):
        parse_seq(b"\x00")


def test_vllm_block_hashes_match_vllm() -> None:
    assert (
        vllm_none_hash().hex() == "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198"
    )
    hashes = vllm_block_hashes(list(range(40)), 16)
    assert [h.hex() for h in hashes] == [
        "fe8fa5dda3210d0ca2031e37cbe3b001186773cd1c710beb2d45fcb51d434798",
        "8be7aaa33831156d316f1f463ae57e643deb63f42e633e2d631df88815cc4629",
    ]  # only full blocks: 40 tokens = 2 blocks of 16
    assert vllm_block_hashes(list(range(40)), 16, seed="other")[0] != hashes[0]


def test_sglang_block_hashes_follow_its_definition() -> None:
    toks = [1, 2, 3, 4, 5]
    first = hashlib.sha256(struct.pack("<II", 1, 2)).digest()
    second = hashlib.sha256(first + struct.pack("<II", 3, 4)).digest()
    assert sglang_block_hashes(toks, 2) == [
        int.from_bytes(first[:8], "big", signed=True),
        int.from_bytes(second[:8], "big", signed=True),
    ]


def test_vllm_event_hashes_are_what_a_real_vllm_engine_reported() -> None:
    # vLLM 0.32 CPU, --block-size 32, prompt token ids 100..179, default env: its BlockStored
    # carried these ints (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1: the digests' low 64 bits)
    assert vllm_event_hashes(list(range(100, 180)), 32) == [702757842669265042, 12727516518541667169]
    assert block_hashes(Flavour.VLLM, list(range(100, 180)), 32) == vllm_event_hashes(list(range(100, 180)), 32)
    assert block_hashes(Flavour.VLLM, list(range(40)), 16, int_hashes=False) == vllm_block_hashes(list(range(40)), 16)


def _vllm_payload(event: dict[str, object], tail: bytes | None = None) -> bytes:
    """A vLLM batch [ts, [event], dp_rank] built by hand (what a buggy or hostile engine could send)."""
    enc = msgspec.msgpack.Encoder()
    raw = enc.encode(event)
    if tail is not None:  # extra_keys [["X"]]: its "X" replaced by *tail*
        raw = raw.replace(b"\xa1X", tail)
    return b"\x93" + enc.encode(1.0) + b"\x91" + raw + enc.encode(0)


_STORED = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1], "block_size": 16,
           "lora_id": None, "medium": None, "lora_name": None}


def test_hostile_batches_are_kv_event_errors_not_crashes_or_stalls() -> None:
    assert decode_batch(Flavour.VLLM, _vllm_payload(_STORED)).events  # the template itself is valid
    deep = _vllm_payload({**_STORED, "extra_keys": [["X"]]}, tail=b"\x91" * 100_000 + b"\xc0")
    with pytest.raises(KVEventError, match="nested too deep"):  # was RecursionError, which killed the subscriber
        decode_batch(Flavour.VLLM, deep)
    with pytest.raises(KVEventError, match="block hashes in one batch"):  # was seconds of CPU on the event loop
        decode_batch(Flavour.VLLM, _vllm_payload({**_STORED, "block_hashes": list(range(MAX_BATCH_HASHES + 1))}))
    with pytest.raises(KVEventError, match="longer than 64 bytes"):  # each kept in the index
        decode_batch(Flavour.VLLM, _vllm_payload({**_STORED, "block_hashes": [b"x" * 1024]}))
    assert decode_batch(Flavour.VLLM, _vllm_payload({**_STORED, "block_hashes": [b"x" * 32] * 10})).events
