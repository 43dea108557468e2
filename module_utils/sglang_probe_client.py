# hicache-fleet: the SGLang HTTP/SSE client of the cold/warm TTFT probe.
# Plain functions, unit-tested in tests/probe; the module library/sglang_cache_probe.py uses them.
# Runs on the managed host with its system Python: standard library and ansible.module_utils only.

from __future__ import annotations

import array
import http.client
import json
import math
import random
import re
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

DONE = "[DONE]"
POLL_INTERVAL_S = 0.5
CONTROL_TIMEOUT_S = 60.0
BODY_EXCERPT = 300
# What a server may make the probe hold in memory: a control response (health, server info, flush),
# one streamed event (one SSE line), and one whole /generate stream. Over a cap the request fails.
MAX_BODY_BYTES = 1 << 20
MAX_EVENT_BYTES = 4 << 20
MAX_STREAM_BYTES = 256 << 20
# C0/C1 controls, DEL, and the Unicode line/paragraph separators and bidi overrides: nothing a server
# sends reaches a message with them (a terminal escape, a CR that rewrites a line, a fake log line).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# Which inventory variables feed each key option, for the message that refuses a malformed key.
KEY_VARIABLES = {
    "api_key": "sglang_service_api_key or the instance's api_key",
    "admin_api_key": "sglang_service_admin_api_key or the instance's admin_api_key",
}


class ProbeError(Exception):
    """A failure with a sentence a person can act on."""


class ConnectError(ProbeError):
    """The server could not be reached at all."""


class MissingAccounting(ProbeError):
    """A /generate response without meta_info.cached_tokens."""


class RedirectError(ProbeError):
    """The server answered a redirect; it is never followed (the key would go along)."""


class HttpStatusError(ProbeError):
    def __init__(self, message: str, status: int, body: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


# ---------------------------------------------------------------------------------------------------
# Plain functions (unit-tested without Ansible)
# ---------------------------------------------------------------------------------------------------


def generate_ids(n: int, vocab_size: int, seed: Any) -> list[int]:
    """Exactly n seeded random token ids in [0, vocab_size). 128K ids cost a few milliseconds."""
    if n < 0 or vocab_size < 1:
        raise ValueError("n must be >= 0 and vocab_size >= 1")
    rng = random.Random(seed)
    words = array.array("I")
    if words.itemsize != 4:  # pragma: no cover - every mainstream platform has 4-byte unsigned int
        return rng.choices(range(vocab_size), k=n)
    words.frombytes(rng.randbytes(4 * n))
    if sys.byteorder == "big":  # pragma: no cover - same ids on big-endian hosts
        words.byteswap()
    return [w % vocab_size for w in words]


def repeated_block_ids(n: int, vocab_size: int, seed: Any, block_len: int) -> list[int]:
    """n ids: one seeded random block of block_len ids, repeated (the last copy cut short).

    After a block has been seen once, a language model copies it: its next tokens on such a prompt
    are near-certain, so a greedy answer is the same on a recomputed and a cached prefix even where
    the floats are not bit-exact (the answer-parity check relies on that). block_len 0: no
    repetition, n random ids."""
    if block_len < 1 or block_len >= n:
        return generate_ids(n, vocab_size, seed)
    block = generate_ids(block_len, vocab_size, seed)
    whole, rest = divmod(n, block_len)
    return block * whole + block[:rest]


def generate_body(ids: list[int], max_new_tokens: int, temperature: float, return_logprob: bool = False) -> bytes:
    """The native /generate request, streamed, with an exact output length.

    return_logprob: ask for meta_info.output_token_logprobs too. logprob_start_len is left unset (-1):
    SGLang then computes no prompt logprobs, so the cached prefix is not shortened (a
    logprob_start_len inside the prompt would cap the prefix match at it)."""
    payload: dict[str, Any] = {
        "input_ids": ids,
        "sampling_params": {
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "ignore_eos": True,
        },
        "stream": True,
    }
    if return_logprob:
        payload["return_logprob"] = True
    return json.dumps(payload, separators=(",", ":")).encode()


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def accumulate_output(acc: dict, event: dict) -> None:
    """Add one streamed event's output token ids and logprobs to acc ({"ids": [...], "logprobs":
    [...]}; a key set to None once that output cannot be trusted or is absent).

    SGLang streams either the whole output so far (the default) or only the new part
    (--incremental-streaming-output; meta_info.output_token_logprobs is then sliced the same way):
    meta_info.completion_tokens tells which; anything else (ids that rewrite earlier ones, a count that
    matches neither) leaves nothing to compare. Logprob entries are [logprob, token_id, text-or-None]."""
    meta = event.get("meta_info") if isinstance(event.get("meta_info"), dict) else {}
    total = meta.get("completion_tokens")
    for key, part in (("ids", event.get("output_ids")), ("logprobs", meta.get("output_token_logprobs"))):
        have = acc.get(key)
        if have is None:
            continue
        if not isinstance(part, list) or not _whole(total):
            acc[key] = None  # absent, or a shape the probe does not know: nothing to compare
            continue
        if key == "ids":
            if not all(_whole(x) for x in part):
                acc[key] = None
                continue
            values = list(part)
        else:
            values = []
            for entry in part:
                value = entry[0] if isinstance(entry, (list, tuple)) and entry else None
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                values.append(float(value) if ok else None)
        # The whole output so far: as many values as tokens generated, or more (SGLang passes a reference
        # to the growing list on intermediate chunks), starting with what came before.
        if len(values) >= total and values[:len(have)] == have:
            acc[key] = values
        elif len(have) + len(values) == total:
            have.extend(values)
        else:
            acc[key] = None


def parse_sse_line(line: bytes) -> Any:
    """One line of an SSE stream: None (blank, comment, other field), DONE, or the decoded event."""
    line = line.strip()
    if not line or line.startswith(b":"):
        return None
    if line.startswith(b"data:"):
        data = line[5:].strip()
    elif line.startswith(b"{"):
        data = line  # a server that answers one JSON object instead of SSE
    else:
        return None
    if data == b"[DONE]":
        return DONE
    try:
        event = json.loads(data)
    except ValueError as exc:
        raise ProbeError(
            "the /generate stream carried an event that is not JSON "
            f"({safe_text(data, 80)}); is the endpoint an SGLang server?"
        ) from exc
    if not isinstance(event, dict):
        raise ProbeError(
            f"the /generate stream carried a non-object event ({safe_text(data, 80)}); is the endpoint an "
            "SGLang server?"
        )
    return event


def event_has_output(event: dict) -> bool:
    """True when a streamed event carries generated output (text or token ids)."""
    if event.get("text"):
        return True
    if event.get("output_ids"):
        return True
    meta = event.get("meta_info")
    return isinstance(meta, dict) and bool(meta.get("completion_tokens"))


def _count(value: object, field: str) -> int:
    """A token count the server reported: a whole number >= 0, or a ProbeError naming the field."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProbeError(f"the server reported {field} = {safe_text(json.dumps(value), 40)}, not a token count "
                         "(a whole number >= 0); the probe does not gate on it. Is the endpoint an SGLang server?")
    return value


def check_sizes(meta: dict, input_len: int | None = None) -> None:
    """The token counts of one response's meta_info make sense, or a ProbeError naming the field: no
    count negative or other than a whole number, cached_tokens at most prompt_tokens (and the prompt
    sent), each tier's share at most cached_tokens."""
    prompt = _count(meta.get("prompt_tokens"), "meta_info.prompt_tokens")
    _count(meta.get("completion_tokens"), "meta_info.completion_tokens")
    cached = _count(meta.get("cached_tokens"), "meta_info.cached_tokens")
    if input_len is not None and prompt > input_len:
        raise ProbeError(f"the server reported meta_info.prompt_tokens {prompt} for a prompt of {input_len} "
                         "tokens; the probe does not gate on it.")
    limit = prompt if meta.get("prompt_tokens") is not None else input_len
    if limit is not None and cached > limit:
        raise ProbeError(f"the server reported meta_info.cached_tokens {cached}, more than the prompt's {limit} "
                         "tokens; the probe does not gate on it.")
    details = meta.get("cached_tokens_details")
    if isinstance(details, dict):
        for tier in ("device", "host", "storage"):
            share = _count(details.get(tier), f"meta_info.cached_tokens_details.{tier}")
            if share > cached:
                raise ProbeError(f"the server reported meta_info.cached_tokens_details.{tier} {share}, more than "
                                 f"meta_info.cached_tokens {cached}; the probe does not gate on it.")


def cached_split(meta: dict) -> dict:
    """cached/device/host/storage tokens of one response's meta_info."""
    cached = int(meta.get("cached_tokens") or 0)
    details = meta.get("cached_tokens_details")
    if isinstance(details, dict):
        device = int(details.get("device") or 0)
        host = int(details.get("host") or 0)
        storage = int(details.get("storage") or 0)
    else:  # SGLang reports no details when nothing was cached, and device-only without HiCache
        device, host, storage = cached, 0, 0
    return {"cached_tokens": cached, "device": device, "host": host, "storage": storage}


def safe_text(value: object, limit: int = BODY_EXCERPT) -> str:
    """Text a server sent, made safe to show: bytes decoded, every control character (CR, LF, ESC,
    NUL, bidi overrides) replaced by a space, runs of spaces collapsed, cut to limit characters."""
    text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
    text = " ".join(_UNSAFE.sub(" ", text).split())
    return text[:limit] + ("…" if len(text) > limit else "")


def _excerpt(body: bytes) -> str:
    return safe_text(body)


def check_key(name: str, key: object) -> None:
    """Refuse a key that cannot go into an HTTP header as it is, naming the option and the inventory
    variables it comes from, never the value (a ProbeError's text reaches logs and reports)."""
    if key is None or key == "":
        return
    if not isinstance(key, str) or any(ch.isspace() or not " " < ch < "\x7f" for ch in key):
        variables = KEY_VARIABLES.get(name, name)
        raise ProbeError(f"{name} ({variables}) contains whitespace, a line break or a character that is not "
                         "printable ASCII, so it cannot be sent in the Authorization header (the value is not "
                         "shown). A key written with `echo key | ansible-vault encrypt_string` ends in a "
                         "newline: encrypt it with `printf %s key | ansible-vault encrypt_string`.")


class _Deadline:
    """An overall deadline for one request, not only per read: when it passes, the connection's
    socket is shut down from a timer thread, so a server that drips a byte at a time (headers or
    body) fails the request in bounded time. expired tells the caller why the read ended."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float) -> None:
        """conn must be connected (conn.connect(), bounded by its own timeout) before."""
        # The socket itself: http.client drops conn.sock when a response says Connection: close,
        # while the response goes on reading from it.
        self.sock = conn.sock
        self.expired = False
        self._timer = threading.Timer(max(seconds, 0.001), self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        self.expired = True
        sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


def read_capped(resp: http.client.HTTPResponse, cap: int, where: str) -> bytes:
    """The whole body, or a ProbeError when it is longer than cap bytes (never more than cap + 1 read)."""
    data = resp.read(cap + 1)
    if len(data) > cap:
        raise ProbeError(f"{where} answered more than {cap} bytes; the probe reads no more (is the endpoint an "
                         "SGLang server?).")
    return data


def _drain(resp: http.client.HTTPResponse, conn: http.client.HTTPConnection) -> None:
    """Read what follows [DONE] (the end of the chunked body), briefly, so closing the connection
    does not reset it under the server's feet."""
    try:
        if conn.sock is not None:
            conn.sock.settimeout(1.0)
        resp.read(64 * 1024)
    except (OSError, http.client.HTTPException):
        pass


URL_EXAMPLE = "e.g. http://127.0.0.1:30000"


def parse_url(url: object) -> tuple[str, str, int, str]:
    """(scheme, host, port, path prefix) of the server's base URL; a ProbeError naming the fault
    for anything else, never a ValueError from urllib."""
    if not isinstance(url, str) or not url.strip():
        raise ProbeError(f"url must be the server's base URL ({URL_EXAMPLE}), got {url!r}.")
    text = url.strip()
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise ProbeError(f"url {url!r} contains whitespace or control characters; give the server's base URL "
                         f"({URL_EXAMPLE}).")
    try:
        parts = urllib.parse.urlsplit(text)
        host = parts.hostname
        port = parts.port
    except ValueError as exc:  # unbalanced [ ] of an IPv6 literal, a port that is no number or out of range
        raise ProbeError(f"url {url!r} is not a valid URL ({exc}); give the server's base URL "
                         f"({URL_EXAMPLE}, IPv6 as http://[::1]:30000).") from exc
    if parts.scheme not in ("http", "https"):
        raise ProbeError(f"url {url!r} must start with http:// or https:// ({URL_EXAMPLE}).")
    if not host:
        raise ProbeError(f"url {url!r} names no host ({URL_EXAMPLE}).")
    if port == 0:
        raise ProbeError(f"url {url!r} has port 0; give the port the server listens on ({URL_EXAMPLE}).")
    if parts.username is not None or parts.password is not None:
        raise ProbeError(f"url {url!r} carries credentials; pass the server's key in api_key instead.")
    if parts.query or parts.fragment:
        raise ProbeError(f"url {url!r} has a query or fragment; give only the server's base URL ({URL_EXAMPLE}).")
    return parts.scheme, host, port or (443 if parts.scheme == "https" else 80), parts.path.rstrip("/")


class SGLangClient:
    def __init__(self, url: str, api_key: str | None = None, request_timeout: float = 900.0,
                 admin_api_key: str | None = None) -> None:
        self.scheme, self.host, self.port, self.prefix = parse_url(url)
        self.url = url.strip().rstrip("/")
        check_key("api_key", api_key)
        check_key("admin_api_key", admin_api_key)
        self.api_key = api_key
        # SGLang's --admin-api-key: when set, admin endpoints (/flush_cache) take only this key.
        self.admin_api_key = admin_api_key
        self.request_timeout = request_timeout
        self.requests_sent = 0

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _headers(self, body: bool, admin: bool = False) -> dict:
        headers = {"Accept": "*/*", "User-Agent": "hicache-fleet-sglang-cache-probe"}
        if body:
            headers["Content-Type"] = "application/json"
        key = self.admin_api_key if admin and self.admin_api_key else self.api_key
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _status_error(self, method: str, path: str, status: int, reason: str, body: bytes) -> HttpStatusError:
        excerpt = _excerpt(body)
        reason = safe_text(reason, 80)
        where = f"{method} {self.url}{path}"
        if status in (401, 403):
            if path == "/flush_cache" and self.admin_api_key:
                msg = (f"{where} answered HTTP {status} ({excerpt or reason}): the server rejected the "
                       "admin_api_key; set admin_api_key to the server's --admin-api-key.")
            elif self.api_key:
                msg = (f"{where} answered HTTP {status} ({excerpt or reason}): the server rejected the api_key; "
                       "set api_key to the server's --api-key (a server with --admin-api-key takes only that "
                       "key on /flush_cache: set admin_api_key).")
            else:
                msg = (f"{where} answered HTTP {status} ({excerpt or reason}): the server requires an API key; "
                       "set the module's api_key option to its --api-key.")
        else:
            msg = f"{where} answered HTTP {status} {reason}: {excerpt or '(empty body)'}"
        return HttpStatusError(msg, status, excerpt)

    def _redirect_error(self, method: str, path: str, resp: http.client.HTTPResponse) -> RedirectError:
        location = safe_text(resp.getheader("Location") or "", 200)
        return RedirectError(f"{method} {self.url}{path} answered HTTP {resp.status} (a redirect"
                             f"{f' to {location}' if location else ''}); the probe follows no redirects and "
                             "sends its key nowhere else: point url at the SGLang server itself.")

    def _deadline_error(self, method: str, path: str, timeout: float) -> ProbeError:
        return ProbeError(f"{method} {self.url}{path}: no complete answer within {timeout:g} s (the deadline of "
                          "the whole request; a server that answers a byte at a time cannot hold the probe "
                          "longer); raise request_timeout or check the server.")

    def _network_error(self, method: str, path: str, exc: BaseException, timeout: float) -> ProbeError:
        where = f"{method} {self.url}{path}"
        if isinstance(exc, ConnectionRefusedError):
            return ConnectError(f"cannot connect to {self.url} (connection refused): is the SGLang server "
                                "running and listening on that host and port?")
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return ProbeError(f"{where}: no answer within {timeout:g} s; raise request_timeout or check the server.")
        if isinstance(exc, socket.gaierror):
            return ConnectError(f"cannot resolve the host of {self.url} ({exc}); check url.")
        return ConnectError(f"{where} failed: {type(exc).__name__}: {safe_text(exc)}")

    def request(self, method: str, path: str, body: bytes | None = None,
                timeout: float | None = None, admin: bool = False) -> tuple[int, bytes]:
        """One plain request; returns (status, body). Raises ConnectError/ProbeError on network faults.
        admin: an admin endpoint, sent with admin_api_key when one is set."""
        timeout = timeout or min(self.request_timeout, CONTROL_TIMEOUT_S)
        conn = self._connection(timeout)
        headers = self._headers(body is not None, admin)
        try:
            self.requests_sent += 1
            try:
                conn.connect()
            except OSError as exc:
                raise self._network_error(method, path, exc, timeout) from exc
            deadline = _Deadline(conn, timeout)
            with deadline:
                try:
                    conn.request(method, self.prefix + path, body=body, headers=headers)
                except ValueError:  # http.client's message would repeat the header, key and all
                    raise ProbeError(f"{method} {self.url}{path}: a request header was refused (the value is "
                                     "not shown); check api_key and admin_api_key.") from None
                resp = conn.getresponse()
                if 300 <= resp.status < 400:
                    raise self._redirect_error(method, path, resp)
                data = read_capped(resp, MAX_BODY_BYTES, f"{method} {self.url}{path}")
            if deadline.expired:  # a body without a length ends at the shutdown, short and silent
                raise self._deadline_error(method, path, timeout)
            return resp.status, data
        except (OSError, http.client.HTTPException) as exc:
            if deadline.expired:
                raise self._deadline_error(method, path, timeout) from exc
            raise self._network_error(method, path, exc, timeout) from exc
        finally:
            conn.close()

    def get_json(self, paths: tuple[str, ...]) -> dict:
        """GET the first of paths that exists (SGLang renamed some endpoints); {} if none does."""
        for path in paths:
            status, data = self.request("GET", path)
            if status == 404:
                continue
            if status != 200:
                raise self._status_error("GET", path, status, "", data)
            try:
                value = json.loads(data)
            except ValueError as exc:
                raise ProbeError(f"GET {self.url}{path} did not return JSON ({_excerpt(data)[:80]}); is the "
                                 "endpoint an SGLang server?") from exc
            return value if isinstance(value, dict) else {}
        return {}

    def stream_generate(self, body: bytes, need_accounting: bool = True,
                        on_cut_hint: str = "", input_len: int | None = None) -> dict:
        """POST /generate with stream=true; TTFT from just before sending to the first output event.
        input_len: the prompt's tokens, which no reported count may exceed (check_sizes)."""
        path = "/generate"
        timeout = self.request_timeout
        conn = self._connection(timeout)
        headers = self._headers(True)
        ttft = None
        events = 0
        received = 0
        last_meta: dict | None = None
        done = False
        cut: str | None = None
        t_last = None
        output: dict = {"ids": [], "logprobs": []}
        try:
            self.requests_sent += 1
            try:
                conn.connect()  # before the clock: TCP setup is not the server's time to first token
            except OSError as exc:
                raise self._network_error("POST", path, exc, timeout) from exc
            t0 = time.perf_counter()
            deadline = _Deadline(conn, timeout)
            with deadline:
                try:
                    conn.request("POST", self.prefix + path, body=body, headers=headers)
                    resp = conn.getresponse()
                except ValueError:  # http.client's message would repeat the header, key and all
                    raise ProbeError(f"POST {self.url}{path}: a request header was refused (the value is not "
                                     "shown); check api_key.") from None
                except (OSError, http.client.HTTPException) as exc:
                    if deadline.expired:
                        raise self._deadline_error("POST", path, timeout) from exc
                    raise self._network_error("POST", path, exc, timeout) from exc
                if 300 <= resp.status < 400:
                    raise self._redirect_error("POST", path, resp)
                if resp.status != 200:
                    try:
                        data = resp.read(64 * 1024)
                    except (OSError, http.client.HTTPException):
                        data = b""
                    raise self._status_error("POST", path, resp.status, resp.reason, data)
                while True:
                    try:
                        line = resp.readline(MAX_EVENT_BYTES + 1)
                    except TimeoutError as exc:
                        raise self._network_error("POST", path, exc, timeout) from exc
                    except (OSError, http.client.HTTPException) as exc:
                        if deadline.expired:
                            raise self._deadline_error("POST", path, timeout) from exc
                        cut = f"{type(exc).__name__}: {safe_text(exc)}"
                        break
                    if deadline.expired:
                        raise self._deadline_error("POST", path, timeout)
                    now = time.perf_counter()
                    if not line:
                        break
                    received += len(line)
                    if len(line) > MAX_EVENT_BYTES:
                        raise ProbeError(f"POST {self.url}{path} streamed an event of more than {MAX_EVENT_BYTES} "
                                         "bytes; the probe reads no more (is the endpoint an SGLang server?).")
                    if received > MAX_STREAM_BYTES:
                        raise ProbeError(f"POST {self.url}{path} streamed more than {MAX_STREAM_BYTES} bytes; the "
                                         "probe reads no more (lower the output lengths, or is the endpoint an "
                                         "SGLang server?).")
                    event = parse_sse_line(line)
                    if event is None:
                        continue
                    t_last = now
                    if event == DONE:
                        done = True
                        _drain(resp, conn)
                        break
                    events += 1
                    if "error" in event and not event_has_output(event):
                        raise ProbeError(f"POST {self.url}{path} reported an error mid-stream: "
                                         f"{_excerpt(json.dumps(event['error']).encode())}")
                    meta = event.get("meta_info")
                    if isinstance(meta, dict):
                        last_meta = meta
                    accumulate_output(output, event)
                    if ttft is None and event_has_output(event):
                        ttft = now - t0
        finally:
            conn.close()
        finished = done or bool(last_meta and last_meta.get("finish_reason") is not None)
        if not finished:
            got = (last_meta or {}).get("completion_tokens")
            raise ProbeError(
                f"the stream of POST {self.url}{path} was cut after {events} events"
                f"{f' and {got} output tokens' if got is not None else ''} without a finish_reason or "
                f"[DONE]{f' ({cut})' if cut else ''}: the server closed the connection mid-way (crash, "
                f"restart, out of memory or a proxy timeout); check the server log."
            )
        if ttft is None:
            raise ProbeError(f"POST {self.url}{path} finished without streaming any output token; is the "
                             "endpoint an SGLang server serving a generation model?")
        meta = last_meta or {}
        if need_accounting and "cached_tokens" not in meta:
            raise MissingAccounting("the response carries no meta_info.cached_tokens")
        check_sizes(meta, input_len)
        split = cached_split(meta)
        return {
            "ttft_s": ttft,
            "e2e_s": (t_last or t0) - t0,
            "events": events,
            "prompt_tokens": meta.get("prompt_tokens"),
            "completion_tokens": meta.get("completion_tokens"),
            "finish_reason": meta.get("finish_reason"),
            "cached_tokens": split["cached_tokens"],
            "device_cached_tokens": split["device"],
            "host_cached_tokens": split["host"],
            "storage_cached_tokens": split["storage"],
            "meta_info": meta,
            # the answer, for the answer-parity check (None: the server did not send it)
            "output_ids": output["ids"],
            "output_logprobs": output["logprobs"],
        }


def wait_until_healthy(client: SGLangClient, ready_timeout: float,
                       clock: Callable[[], float] = time.monotonic) -> float:
    """Poll /health_generate (or /health) until 200; returns the seconds waited."""
    start = clock()
    deadline = start + ready_timeout
    last = "no answer"
    path = "/health_generate"
    attempts = 0
    refused = False
    max_attempts = int(ready_timeout / POLL_INTERVAL_S) + 3
    while attempts < max_attempts:
        attempts += 1
        remaining = deadline - clock()
        try:
            status, data = client.request("GET", path, timeout=max(min(remaining, CONTROL_TIMEOUT_S), 1.0))
        except ConnectError as exc:
            last = str(exc)
            refused = True
        except RedirectError:
            raise
        except ProbeError as exc:
            last = str(exc)
            refused = False
        else:
            refused = False
            if status == 200:
                return clock() - start
            if status == 404 and path == "/health_generate":
                path = "/health"
                continue
            if status in (401, 403):
                raise client._status_error("GET", path, status, "", data)
            last = f"GET {client.url}{path} answered HTTP {status}" + (f" ({_excerpt(data)})" if data else "")
        remaining = deadline - clock()
        if remaining <= 0:
            break
        time.sleep(min(POLL_INTERVAL_S, remaining))
    if refused:
        raise ConnectError(f"{last} (kept trying for ready_timeout {ready_timeout:g} s)")
    raise ProbeError(f"the server at {client.url} did not become healthy within ready_timeout "
                     f"{ready_timeout:g} s; last answer: {last}. Is the model still loading (raise "
                     "ready_timeout) or did it fail to start (check its log)?")


def flush_cache(client: SGLangClient, flush_timeout: float,
                clock: Callable[[], float] = time.monotonic) -> int:
    """POST /flush_cache, retried while the server refuses (busy); returns the attempts made."""
    deadline = clock() + flush_timeout
    attempts = 0
    max_attempts = int(flush_timeout / POLL_INTERVAL_S) + 3
    last = ""
    while attempts < max_attempts:
        attempts += 1
        status, data = client.request("POST", "/flush_cache", body=b"", admin=True)
        if status == 200:
            return attempts
        if status in (401, 403, 404) or status >= 500:
            raise client._status_error("POST", "/flush_cache", status, "", data)
        last = f"HTTP {status} {_excerpt(data)}"
        remaining = deadline - clock()
        if remaining <= 0:
            break
        time.sleep(min(POLL_INTERVAL_S, remaining))
    raise ProbeError(f"POST {client.url}/flush_cache was refused for flush_timeout {flush_timeout:g} s "
                     f"({attempts} attempts, last: {last}); the server stays busy with other requests: "
                     "stop the traffic to this host (drain it) or raise flush_timeout.")
