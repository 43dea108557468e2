"""The simulator's "model output": which ids a request generates, and their logprobs.

No model runs. The output is a pure function of the prompt's ids (and, when sampling, of a
per-request nonce), so that a cold and a warm greedy read of the same prompt can be compared:

- Greedy (``temperature`` 0, or ``top_k`` 1, as SGLang's sampling_params.py treats them): the
  same prompt gives the same ids and logprobs in every process and on every machine. The seed is
  a BLAKE2b digest of the whole canonical prompt (not Python's per-process ``hash()``).
- A prompt that ends with a block of ids repeated at least twice (``B B`` or ``B B ... B`` with
  the block B of K ids) is continued as a language model continues it: the next ids are B's ids
  again, in order, with logprobs near 0 (deterministic, in [-0.01, -0.001]).
- Any other prompt gives stable pseudo-random ids in [0, vocab_size) with logprobs in
  [-3.0, -0.3].
- Sampling (temperature > 0, SGLang's default 1.0): a repeated block is still copied (a model
  copies with probability near 1); other prompts give ids that vary per request unless
  ``sampling_params.sampling_seed`` is set (then they are fixed by prompt and seed).

The corrupt_* faults (``Output.corrupt_from``) replace the ids from a fixed index on with other
ids (never equal to the clean id at that position) and plausible logprobs in [-2.5, -0.2], as a
KV cache read back wrong would.
"""

from __future__ import annotations

import hashlib
import os
import struct

# The corrupt_* faults: output tokens from this index on (the 4th token) differ from the clean
# answer; the first CORRUPT_FROM tokens are the clean ones.
CORRUPT_FROM = 3

# How far back a repeated block is looked for (tokens); the block may be up to half of this.
REPEAT_WINDOW = 8192


def prompt_digest(data: bytes) -> bytes:
    """A stable 16-byte digest of the canonical prompt bytes (b"12,345,")."""
    return hashlib.blake2b(data, digest_size=16).digest()


def tail_ids(data: bytes, count: int = REPEAT_WINDOW) -> list[int]:
    """The last ``count`` ids of canonical bytes, without parsing the rest. An id and its comma
    take at most 21 bytes, so the last count x 21 bytes hold count whole ids after the piece the
    cut may split, and that piece falls outside the last ``count``."""
    parts = data[-count * 21:].split(b",")[:-1]
    return [int(p) for p in parts[-count:]]


def repeated_block(ids: list[int]) -> list[int] | None:
    """The shortest block B such that ``ids`` ends with B B, else None."""
    n = len(ids)
    if n < 2:
        return None
    last = ids[-1]
    for k in range(1, n // 2 + 1):
        if ids[-1 - k] != last:
            continue
        if ids[-k:] == ids[-2 * k:-k]:
            return ids[-k:]
    return None


def _stream(key: bytes, index: int) -> int:
    """64 pseudo-random bits for position ``index`` under ``key`` (stable everywhere)."""
    digest = hashlib.blake2b(struct.pack("<Q", index), key=key[:64], digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _between(bits: int, low: float, high: float) -> float:
    return round(low + (bits % 1_000_000) / 1_000_000 * (high - low), 6)


class Output:
    """The ids and logprobs generated for one request (index i = the i-th output token)."""

    def __init__(self, data: bytes, vocab_size: int, greedy: bool = True,
                 sampling_seed: int | None = None, corrupt_from: int | None = None) -> None:
        self.vocab = vocab_size
        self.digest = prompt_digest(data)
        if greedy:
            self.key = b"greedy" + self.digest
        elif sampling_seed is not None:
            self.key = b"seeded" + self.digest + str(sampling_seed).encode()
        else:
            self.key = b"sampled" + self.digest + os.urandom(8)
        self.block = repeated_block(tail_ids(data))
        self.corrupt_from = corrupt_from

    def clean(self, index: int) -> tuple[int, float]:
        bits = _stream(self.key, index)
        if self.block is not None:
            return self.block[index % len(self.block)] % self.vocab, _between(bits, -0.01, -0.001)
        return bits % self.vocab, _between(bits >> 20, -3.0, -0.3)

    def token(self, index: int) -> tuple[int, float]:
        """(token id, logprob) of output token ``index``."""
        token_id, logprob = self.clean(index)
        if self.corrupt_from is None or index < self.corrupt_from:
            return token_id, logprob
        bits = _stream(b"corrupt" + self.key, index)
        bad = bits % self.vocab
        if bad == token_id:
            bad = (bad + 1) % self.vocab
        return bad, _between(bits >> 20, -2.5, -0.2)


def input_logprob(digest: bytes, position: int) -> float:
    """The logprob of prompt token ``position`` (> 0) given the ones before (plausible, stable)."""
    return _between(_stream(b"input" + digest, position), -8.0, -0.05)
