"""The simulator's deterministic tokenizer.

A text is encoded as UTF-8, padded with NUL bytes to a multiple of 4, and read as little-endian
unsigned 32-bit integers: each 4-byte group is one token, and its id is that integer modulo the
model's vocab_size. ``tokenize(text, vocab)`` therefore gives the same ids on every machine and
run, so sending a text or the ids it tokenizes to hits the same cache (the ids are what the cache
sees). 4 bytes per token is about the density of real tokenizers on English text. POST /tokenize
returns these ids.

Chat messages become a text with a ChatML-like template before tokenizing (``render_chat``).
"""

from __future__ import annotations

import sys
from array import array
from typing import Any

_WORDS = (
    "the", "cache", "host", "tier", "simulated", "token", "prefix", "page", "device", "pool",
    "radix", "warm", "cold", "reuse", "model", "answer",
)


def tokenize(text: str, vocab_size: int) -> array:
    """Token ids (array of int64) for ``text``; see the module docstring for the scheme."""
    data = text.encode("utf-8")
    pad = (-len(data)) % 4
    if pad:
        data += b"\0" * pad
    words = array("I")
    words.frombytes(data)
    if sys.byteorder != "little":
        words.byteswap()
    if vocab_size >= 1 << 32:
        return array("q", words)
    return array("q", [w % vocab_size for w in words])


def render_chat(messages: list[dict[str, Any]]) -> str:
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts
            content = "".join(
                p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
            )
        parts.append(f"<|im_start|>{message.get('role', 'user')}\n{content or ''}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def output_piece(seed: int, index: int) -> str:
    """The text of generated token ``index`` for a prompt whose cache key is ``seed``."""
    return " " + _WORDS[(seed + index * 7) % len(_WORDS)]


def output_id(seed: int, index: int, vocab_size: int) -> int:
    return (seed * 31 + index * 1009 + 17) % vocab_size
