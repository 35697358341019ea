"""KV-cache events: the engines' wire formats and block hashing (pure, no I/O).

vLLM (``vllm/distributed/kv_events.py``, checked against vLLM 0.32) and SGLang
(``sglang/srt/disaggregation/kv_events.py``) publish the same three events over ZMQ PUB, msgpack
encoded with msgspec, but not in the same shape (docs/kv-events.md has the byte-level details):

- vLLM: ``KVEventBatch`` = ``[ts, [event, ...], data_parallel_rank]``; each event is a *map*
  tagged ``{"type": "BlockStored", ...}``; block hashes are 64-bit ints by default (the low bits
  of 32-byte SHA-256 digests, which are sent instead with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).
- SGLang: ``[ts, [event, ...]]``; each event is an *array* tagged by its first element
  (``["BlockStored", hashes, parent, token_ids, block_size, lora_id]``); block hashes are signed
  64-bit integers.

The structs below mirror the engines' own msgspec definitions field for field (order included), so
our encoder produces the bytes the engines produce and our decoder accepts theirs.

Block hashes: vLLM chains ``sha256(pickle((parent, tuple(block_tokens), extra_keys)))`` from
``NONE_HASH = sha256(pickle(seed))`` (seed ``"vllm-none-hash"`` unless ``PYTHONHASHSEED`` is set)
and, by default (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``), reports the digest's low 64 bits as
an unsigned int;
SGLang chains ``sha256(parent_digest + uint32le(token) ...)`` per page and reports the first
8 digest bytes as a signed int64.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgspec

# The replay socket's end-of-replay marker: sequence number -1, 8 bytes big endian signed.
END_SEQ = (-1).to_bytes(8, "big", signed=True)
DEFAULT_VLLM_SEED = "vllm-none-hash"
MAX_SEQ = (1 << 63) - 1

BlockHash = bytes | int


class Flavour(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


class KVEventError(ValueError):
    """A payload that is not a KV event batch of the expected flavour."""


# --- vLLM's structs (map-tagged events, batch as array) -----------------------------------------


class _VBatchBase(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _VEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class _VBlockStored(_VEvent, tag="BlockStored"):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class _VBlockRemoved(_VEvent, tag="BlockRemoved"):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class _VAllBlocksCleared(_VEvent, tag="AllBlocksCleared"):
    pass


class _VBatch(_VBatchBase):
    events: list[_VBlockStored | _VBlockRemoved | _VAllBlocksCleared]


# --- SGLang's structs (array-tagged events) -------------------------------------------------------


class _SBatchBase(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class _SEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class _SBlockStored(_SEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class _SBlockRemoved(_SEvent, tag="BlockRemoved"):
    block_hashes: list[int]


class _SAllBlocksCleared(_SEvent, tag="AllBlocksCleared"):
    pass


class _SBatch(_SBatchBase):
    events: list[_SBlockStored | _SBlockRemoved | _SAllBlocksCleared]


# --- Motor's flavour-neutral view -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[KVEvent, ...]
    dp_rank: int | None = None


_ENC = msgspec.msgpack.Encoder()
_VDEC = msgspec.msgpack.Decoder(_VBatch)
_SDEC = msgspec.msgpack.Decoder(_SBatch)


def encode_batch(flavour: Flavour, batch: EventBatch, *, medium: str = "GPU") -> bytes:
    """The payload frame the engine of *flavour* would publish for *batch*."""
    if flavour is Flavour.VLLM:
        vev: list[_VBlockStored | _VBlockRemoved | _VAllBlocksCleared] = []
        for e in batch.events:
            if isinstance(e, BlockStored):
                vev.append(
                    _VBlockStored(
                        block_hashes=list(e.block_hashes),
                        parent_block_hash=e.parent_block_hash,
                        token_ids=list(e.token_ids),
                        block_size=e.block_size,
                        lora_id=None,
                        medium=medium,
                        lora_name=None,
                        group_idx=0,
                    )
                )
            elif isinstance(e, BlockRemoved):
                vev.append(
                    _VBlockRemoved(block_hashes=list(e.block_hashes), medium=medium, group_idx=0)
                )
            else:
                vev.append(_VAllBlocksCleared())
        dp = 0 if batch.dp_rank is None else batch.dp_rank
        return _ENC.encode(_VBatch(ts=batch.ts, events=vev, data_parallel_rank=dp))
    sev: list[_SBlockStored | _SBlockRemoved | _SAllBlocksCleared] = []
    for e in batch.events:
        if isinstance(e, BlockStored):
            sev.append(
                _SBlockStored(
                    block_hashes=[_as_int(h) for h in e.block_hashes],
                    parent_block_hash=None
                    if e.parent_block_hash is None
                    else _as_int(e.parent_block_hash),
                    token_ids=list(e.token_ids),
                    block_size=e.block_size,
                    lora_id=None,
                )
            )
        elif isinstance(e, BlockRemoved):
            sev.append(_SBlockRemoved(block_hashes=[_as_int(h) for h in e.block_hashes]))
        else:
            sev.append(_SAllBlocksCleared())
    return _ENC.encode(_SBatch(ts=batch.ts, events=sev))


def _as_int(h: BlockHash) -> int:
    if isinstance(h, int):
        return h
    raise KVEventError("SGLang block hashes are integers")


# Bounds on one batch (the index applies it on the event loop that serves requests): vLLM's block
# hashes are 32-byte digests (or 64-bit ints), and a step of a real engine stores far fewer blocks.
MAX_BATCH_HASHES = 65_536
MAX_HASH_BYTES = 64


def decode_batch(flavour: Flavour, payload: bytes) -> EventBatch:
    """Parse one payload frame; :class:`KVEventError` (with msgspec's reason) when it is not one."""
    try:
        raw: _VBatch | _SBatch = (_VDEC if flavour is Flavour.VLLM else _SDEC).decode(payload)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise KVEventError(f"not a {flavour.value} KV event batch: {exc}") from None
    except RecursionError:  # an untyped field (extra_keys) nested deeper than Python's stack
        raise KVEventError(f"not a {flavour.value} KV event batch: nested too deep") from None
    out: list[KVEvent] = []
    hashes = 0
    for e in raw.events:
        if isinstance(e, _VBlockStored | _SBlockStored | _VBlockRemoved | _SBlockRemoved):
            hashes += len(e.block_hashes)
            if hashes > MAX_BATCH_HASHES:
                raise KVEventError(f"more than {MAX_BATCH_HASHES} block hashes in one batch")
            if any(isinstance(h, bytes) and len(h) > MAX_HASH_BYTES for h in e.block_hashes):
                raise KVEventError(f"a block hash longer than {MAX_HASH_BYTES} bytes")
        if isinstance(e, _VBlockStored | _SBlockStored):
            if e.block_size <= 0:
                raise KVEventError("BlockStored.block_size must be positive")
            out.append(
                BlockStored(
                    tuple(e.block_hashes), e.parent_block_hash, tuple(e.token_ids), e.block_size
                )
            )
        elif isinstance(e, _VBlockRemoved | _SBlockRemoved):
            out.append(BlockRemoved(tuple(e.block_hashes)))
        else:
            out.append(AllBlocksCleared())
    dp = raw.data_parallel_rank if isinstance(raw, _VBatch) else None
    return EventBatch(raw.ts, tuple(out), dp)


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def parse_seq(frame: bytes) -> int:
    """A sequence frame (8 bytes, big endian, signed so that END_SEQ reads -1)."""
    if len(frame) != 8:
        raise KVEventError(f"sequence frame must be 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


# --- block hashing --------------------------------------------------------------------------------


def vllm_none_hash(seed: str = DEFAULT_VLLM_SEED) -> bytes:
    return hashlib.sha256(pickle.dumps(seed, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def vllm_block_hashes(
    token_ids: Sequence[int], block_size: int, seed: str = DEFAULT_VLLM_SEED
) -> list[bytes]:
    """vLLM's chained block hashes of the *full* blocks of *token_ids* (``sha256`` algorithm, no
    LoRA / multimodal / cache_salt extra keys): ``sha256(pickle((parent, tuple(block), None)))``."""
    parent = vllm_none_hash(seed)
    out: list[bytes] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = tuple(int(t) for t in token_ids[start : start + block_size])
        parent = hashlib.sha256(
            pickle.dumps((parent, block, None), protocol=pickle.HIGHEST_PROTOCOL)
        ).digest()
        out.append(parent)
    return out


_U32 = struct.Struct("<I")


def sglang_block_hashes(token_ids: Sequence[int], page_size: int) -> list[int]:
    """SGLang's per-page chained hashes as reported in events: ``sha256(prior_digest ||
    uint32le(t) for t in page)``, first 8 bytes as a signed int64."""
    prior = b""
    out: list[int] = []
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        h = hashlib.sha256(prior)
        for t in token_ids[start : start + page_size]:
            h.update(_U32.pack(t))
        prior = h.digest()
        out.append(int.from_bytes(prior[:8], "big", signed=True))
    return out


def vllm_int_hash(h: bytes) -> int:
    """What vLLM's events carry with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`` (its default): the
    digest's low 64 bits, unsigned (``maybe_convert_block_hash``)."""
    return int.from_bytes(h, "big") & ((1 << 64) - 1)


def block_hashes(
    flavour: Flavour,
    token_ids: Sequence[int],
    block_size: int,
    seed: str | None = None,
    *,
    int_hashes: bool = True,
) -> list[BlockHash]:
    """The block hashes as the engine's events report them (vLLM: 64-bit ints by default, the
    32-byte digests with ``int_hashes=False``; SGLang: signed int64)."""
    return list(iter_block_hashes(flavour, token_ids, block_size, seed, int_hashes=int_hashes))


def iter_block_hashes(
    flavour: Flavour,
    token_ids: Sequence[int],
    block_size: int,
    seed: str | None = None,
    *,
    int_hashes: bool = True,
) -> Iterator[BlockHash]:
    """:func:`block_hashes`, one block at a time: a caller that stops early (no engine holds the
    next block) pays only for the blocks it looked at."""
    if flavour is Flavour.VLLM:
        parent = vllm_none_hash(seed or DEFAULT_VLLM_SEED)
        for start in range(0, len(token_ids) - block_size + 1, block_size):
            block = tuple(int(t) for t in token_ids[start : start + block_size])
            parent = hashlib.sha256(pickle.dumps((parent, block, None), protocol=pickle.HIGHEST_PROTOCOL)).digest()
            yield vllm_int_hash(parent) if int_hashes else parent
        return
    prior = b""
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        h = hashlib.sha256(prior)
        for t in token_ids[start : start + block_size]:
            h.update(_U32.pack(t))
        prior = h.digest()
        yield int.from_bytes(prior[:8], "big", signed=True)


def vllm_event_hashes(token_ids: Sequence[int], block_size: int, seed: str = DEFAULT_VLLM_SEED) -> list[int]:
    """vLLM's block hashes in its events' default (int) form."""
    return [vllm_int_hash(h) for h in vllm_block_hashes(token_ids, block_size, seed)]
