# hicache-fleet: the SGLang HTTP/SSE client of the cold/warm TTFT probe.
# Plain functions, unit-tested in tests/probe; the module library/sglang_cache_probe.py uses them.
# Runs on the managed host with its system Python: standard library and ansible.module_utils only.

from __future__ import annotations

import array
import http.client
import json
import random
import socket
import sys
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

DONE = "[DONE]"
POLL_INTERVAL_S = 0.5
CONTROL_TIMEOUT_S = 60.0
BODY_EXCERPT = 300


class ProbeError(Exception):
    """A failure with a sentence a person can act on."""


class ConnectError(ProbeError):
    """The server could not be reached at all."""


class MissingAccounting(ProbeError):
    """A /generate response without meta_info.cached_tokens."""


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


def generate_body(ids: list[int], max_new_tokens: int, temperature: float) -> bytes:
    """The native /generate request, streamed, with an exact output length."""
    payload = {
        "input_ids": ids,
        "sampling_params": {
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "ignore_eos": True,
        },
        "stream": True,
    }
    return json.dumps(payload, separators=(",", ":")).encode()


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
            f"({data[:80]!r}); is the endpoint an SGLang server?"
        ) from exc
    if not isinstance(event, dict):
        raise ProbeError(
            f"the /generate stream carried a non-object event ({data[:80]!r}); is the endpoint an "
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


def _excerpt(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip().replace("\n", " ")
    return text[:BODY_EXCERPT] + ("…" if len(text) > BODY_EXCERPT else "")


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

    def _network_error(self, method: str, path: str, exc: BaseException, timeout: float) -> ProbeError:
        where = f"{method} {self.url}{path}"
        if isinstance(exc, ConnectionRefusedError):
            return ConnectError(f"cannot connect to {self.url} (connection refused): is the SGLang server "
                                "running and listening on that host and port?")
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return ProbeError(f"{where}: no answer within {timeout:g} s; raise request_timeout or check the server.")
        if isinstance(exc, socket.gaierror):
            return ConnectError(f"cannot resolve the host of {self.url} ({exc}); check url.")
        return ConnectError(f"{where} failed: {type(exc).__name__}: {exc}")

    def request(self, method: str, path: str, body: bytes | None = None,
                timeout: float | None = None, admin: bool = False) -> tuple[int, bytes]:
        """One plain request; returns (status, body). Raises ConnectError/ProbeError on network faults.
        admin: an admin endpoint, sent with admin_api_key when one is set."""
        timeout = timeout or min(self.request_timeout, CONTROL_TIMEOUT_S)
        conn = self._connection(timeout)
        try:
            self.requests_sent += 1
            conn.request(method, self.prefix + path, body=body, headers=self._headers(body is not None, admin))
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, data
        except (OSError, http.client.HTTPException) as exc:
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
                        on_cut_hint: str = "") -> dict:
        """POST /generate with stream=true; TTFT from just before sending to the first output event."""
        path = "/generate"
        timeout = self.request_timeout
        conn = self._connection(timeout)
        headers = self._headers(True)
        ttft = None
        events = 0
        last_meta: dict | None = None
        done = False
        cut: str | None = None
        t_last = None
        try:
            self.requests_sent += 1
            try:
                conn.connect()  # before the clock: TCP setup is not the server's time to first token
            except OSError as exc:
                raise self._network_error("POST", path, exc, timeout) from exc
            t0 = time.perf_counter()
            try:
                conn.request("POST", self.prefix + path, body=body, headers=headers)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                raise self._network_error("POST", path, exc, timeout) from exc
            if resp.status != 200:
                try:
                    data = resp.read(64 * 1024)
                except (OSError, http.client.HTTPException):
                    data = b""
                raise self._status_error("POST", path, resp.status, resp.reason, data)
            deadline = t0 + timeout
            while True:
                try:
                    line = resp.readline()
                except TimeoutError as exc:
                    raise self._network_error("POST", path, exc, timeout) from exc
                except (OSError, http.client.HTTPException) as exc:
                    cut = f"{type(exc).__name__}: {exc}"
                    break
                now = time.perf_counter()
                if not line:
                    break
                if now > deadline:
                    raise ProbeError(f"POST {self.url}{path} streamed for more than request_timeout "
                                     f"{timeout:g} s; raise request_timeout.")
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
