"""The simulator's deterministic tokenizer.

A text is encoded as UTF-8, padded with NUL bytes to a multiple of 4, and read as little-endian
unsigned 32-bit integers: each 4-byte group is one token, and its id is that integer modulo the
model's vocab_size. ``tokenize(text, vocab)`` therefore gives the same ids on every machine and
run, so sending a text or the ids it tokenizes to hits the same cache (the ids are what the cache
sees). 4 bytes per token is about the density of real tokenizers on English text. POST /tokenize
returns these ids.

Chat messages become a text with a ChatML-like template before tokenizing (``render_chat``).

The cache and the engine see a prompt in its canonical form (``canonical``): each id in decimal
followed by a comma. ``ids_segment_to_canonical`` produces the same bytes straight from the text
of a JSON list of ints, so 128K input ids never become 128K Python ints.
"""

from __future__ import annotations

import functools
import re
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


_DIGITS_AND_COMMA = b"0123456789,"
_SIGNED_ID = re.compile(rb"0|-?[1-9][0-9]*")

_JSON_SPACE = b" \t\r\n"


class IdsFormatError(ValueError):
    """The input ids are not a flat list of non-negative integers."""


class OutOfVocabError(IdsFormatError):
    """A token id outside [0, vocab_size); ``token_id`` is the first such id."""

    def __init__(self, token_id: int, vocab_size: int | None = None) -> None:
        self.token_id = token_id
        self.vocab_size = vocab_size
        super().__init__(out_of_vocab_message(token_id, vocab_size))


def out_of_vocab_message(token_id: int, vocab_size: int | None) -> str:
    """Worded as SGLang 0.5.23's tokenizer manager words its own vocabulary check
    (managers/tokenizer_manager.py, ``_validate_token_ids_logprob``)."""
    valid = f"[0, {vocab_size})" if vocab_size is not None else "[0, vocab_size)"
    return f"input_ids contains out-of-vocabulary token id {token_id}; valid range is {valid}."


@functools.lru_cache(maxsize=8)
def _out_of_vocab_pattern(vocab_size: int) -> re.Pattern[bytes]:
    """One id (between commas) that is >= vocab_size: more digits than vocab_size - 1, or as many
    and greater digit by digit (canonical ids have no leading zeros)."""
    top = str(vocab_size - 1).encode()
    width = len(top)
    alternatives = [b"[0-9]{%d,}" % (width + 1)]
    for i, digit in enumerate(top):
        if digit < ord("9"):
            alternatives.append(
                re.escape(top[:i]) + b"[" + bytes([digit + 1]) + b"-9]" + b"[0-9]" * (width - i - 1)
            )
    return re.compile(b"(?:^|,)(" + b"|".join(alternatives) + b"),")


def first_out_of_vocab(data: bytes, vocab_size: int) -> int | None:
    """The first id of canonical bytes that is >= vocab_size, else None.

    One compiled regular-expression search over the bytes (a few ms for 128K ids), no per-id
    Python work.
    """
    if not data or vocab_size >= 1 << 63:
        return None
    match = _out_of_vocab_pattern(vocab_size).search(data)
    return int(match.group(1)) if match else None


def canonical(ids) -> bytes:
    """Canonical bytes of a sequence of ids: b"12,345,6789," (empty for no ids)."""
    ids = list(ids)
    if not ids:
        return b""
    if any(not isinstance(i, int) or isinstance(i, bool) for i in ids):
        raise IdsFormatError("input_ids must be a list of non-negative integers")
    negative = next((i for i in ids if i < 0), None)
    if negative is not None:
        raise OutOfVocabError(negative)
    return (str(ids)[1:-1].replace(", ", ",") + ",").encode()


def ids_segment_to_canonical(segment: bytes) -> bytes:
    """Canonical bytes from the inside of a JSON list of ints (between the brackets)."""
    compact = segment.translate(None, _JSON_SPACE)
    if not compact:
        return b""
    if b"-" in compact:
        _raise_negative(compact)
    if compact.translate(None, _DIGITS_AND_COMMA) or compact.startswith(b",") or (
        compact.endswith(b",") or b",," in compact
    ):
        raise IdsFormatError("input_ids must be a list of non-negative integers")
    if _has_leading_zero(compact):
        raise IdsFormatError("input_ids must be a list of non-negative integers")
    return compact + b","


def _raise_negative(compact: bytes) -> None:
    """A list holding a well-formed negative id: out of vocabulary, as SGLang would say."""
    parts = compact.split(b",")
    if all(_SIGNED_ID.fullmatch(part) for part in parts):
        raise OutOfVocabError(int(next(p for p in parts if p.startswith(b"-"))))
    raise IdsFormatError("input_ids must be a list of non-negative integers")


def _has_leading_zero(compact: bytes) -> bool:
    """Whether an id is written with a leading zero ("007"), which would give one id two forms.
    Scans only the places where an id starts with 0 (id 0 itself), not the whole text."""
    if compact[:1] == b"0" and compact[1:2].isdigit():
        return True
    at = compact.find(b",0")
    while at >= 0:
        if compact[at + 2:at + 3].isdigit():
            return True
        at = compact.find(b",0", at + 2)
    return False


def canonical_to_ids(data: bytes) -> list[int]:
    return [int(p) for p in data.split(b",")[:-1]]


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


def output_piece(token_id: int) -> str:
    """The text of a generated token: a word picked by its id (the simulator has no vocabulary)."""
    return " " + _WORDS[token_id % len(_WORDS)]


def token_text(token_id: int) -> str:
    """The text of a prompt token: the inverse of ``tokenize`` for ids below 2**32 (4 bytes,
    little-endian, NUL padding dropped; undecodable bytes replaced)."""
    raw = (token_id % (1 << 32)).to_bytes(4, "little").rstrip(b"\0")
    return raw.decode("utf-8", errors="replace")
