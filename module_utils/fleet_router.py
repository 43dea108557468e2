# hicache-fleet: the rollout's router membership (roles/rollout_router check, leave, join)
# as one call: list the sglang-router's workers (GET /workers), take this host's leaving instances out
# (DELETE /workers/{id}) and wait until the router no longer lists them, or put them in (POST /workers)
# and wait until it lists them healthy.
# Every request is bounded (bytes read, a deadline for the whole request, no redirect followed); the
# polls share one deadline (wait_s); only a 200 whose JSON object has a list of workers is an answer
# (a 5xx is never "gone"); a worker id the router supplied is percent-encoded whole in a URL; the
# router's text reaches a message only stripped of control characters and cut short.
# Plain functions, unit-tested in tests/router; the module library/fleet_router.py uses them.
# Runs where rollout_router_delegate_to says (the controller by default): standard library only.

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from ansible.module_utils.sglang_probe_client import _Deadline, safe_text

STATES = ("read", "out", "in")
# What the router may make the module hold in memory for one answer.
MAX_BODY_BYTES = 4 << 20
REQUEST_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 1.0
LAST_POLL_S = 0.25
EXCERPT = 200
DELETE_OK = (200, 202, 204)
POST_OK = (200, 201, 202)
# The same rule as roles/rollout_router tasks/check.yml's assert and preflight: http(s)://HOST[:PORT][/], no user@.
_BASE_URL = re.compile(r"^https?://[^/@\s]+/?$")

ARGUMENT_SPEC = {
    "url": {"type": "str", "required": True},
    "api_key": {"type": "str", "default": "", "no_log": True},
    "state": {"type": "str", "default": "read", "choices": list(STATES)},
    "ports": {"type": "dict", "default": {}},
    "names": {"type": "list", "elements": "str"},
    "worker_scheme": {"type": "str", "default": "http", "choices": ["http", "https"]},
    "worker_host": {"type": "str", "default": ""},
    "wait_s": {"type": "int", "default": 120},
    "drain_grace_s": {"type": "int", "default": 10},
    "poll_interval": {"type": "float", "default": POLL_INTERVAL_S},
    "timeout": {"type": "float", "default": REQUEST_TIMEOUT_S},
    "validate_certs": {"type": "bool", "default": True},
}


class RouterError(Exception):
    """A failure with a sentence a person can act on; result holds what was done before it."""

    def __init__(self, message: str, **result: Any) -> None:
        super().__init__(message)
        self.result = result


class Answer:
    """One HTTP answer: its status, its body (at most MAX_BODY_BYTES) and a redirect's Location."""

    def __init__(self, status: int, body: bytes = b"", location: str = "") -> None:
        self.status = status
        self.body = body
        self.location = location


# ---------------------------------------------------------------------------------------------------
# Plain functions (unit-tested without Ansible)
# ---------------------------------------------------------------------------------------------------


def redact(url: object) -> str:
    """A URL as it may be shown: a user:password@ left out."""
    return re.sub(r"://[^/@]*@", "://", str(url))


def worker_url(base: str, worker_id: Any) -> str:
    """The router's URL of one worker, ``<base>/workers/<id>``, the id (which the router supplied)
    percent-encoded whole (``/``, ``?``, ``#``, ``..`` cannot steer the request elsewhere); the same
    as roles/router's router_worker_url filter."""
    return f"{str(base).rstrip('/')}/workers/{urllib.parse.quote(str(worker_id), safe='')}"


def check_params(p: dict) -> list[str]:
    """What is wrong with the options, each naming the rollout variable to change; never a key."""
    errors = []
    url = p.get("url") or ""
    if not _BASE_URL.match(url):
        errors.append(f"rollout_router_url={json.dumps(redact(url))} is not a router base URL without credentials: "
                      "set it to http://HOST:PORT (the sglang-router's address; its key goes in "
                      "rollout_router_api_key), or to \"\" for no router.")
    else:
        try:
            port = urllib.parse.urlsplit(url).port
        except ValueError:
            port = 0
        if port == 0:
            errors.append(f"rollout_router_url={json.dumps(url)} has no valid port: set it to http://HOST:PORT.")
    key = p.get("api_key") or ""
    if any(ch.isspace() or not " " < ch < "\x7f" for ch in key):
        errors.append("rollout_router_api_key contains whitespace, a line break or a character that is not printable "
                      "ASCII, so it cannot be sent in the Authorization header (the value is not shown). A key "
                      "written with `echo key | ansible-vault encrypt_string` ends in a newline: encrypt it with "
                      "`printf %s key | ansible-vault encrypt_string`.")
    if p.get("wait_s", 1) < 1:
        errors.append(f"rollout_router_wait_s={p.get('wait_s')} must be at least 1 second.")
    if p.get("drain_grace_s", 0) < 0:
        errors.append(f"rollout_router_drain_grace_s={p.get('drain_grace_s')} must be 0 or more seconds.")
    if not p.get("timeout", 1) > 0 or not p.get("poll_interval", 1) > 0:
        errors.append("timeout and poll_interval must be more than 0 seconds.")
    ports = p.get("ports") or {}
    unknown = [n for n in (p.get("names") or []) if n not in ports]
    if unknown:
        errors.append(f"names {', '.join(unknown)} are not among this host's instances "
                      f"({', '.join(sorted(ports)) or 'none deployed'}; sglang_service_deployed).")
    if ports and not p.get("worker_host"):
        errors.append("worker_host (rollout_router_worker_host) is empty: set the address the router reaches "
                      "this host's instances at.")
    if p.get("state") in ("out", "in") and not ports:
        errors.append("no instance to take out or put in: ports (sglang_service_deployed) is empty.")
    return errors


def instance_urls(ports: dict, scheme: str, host: str) -> dict[str, str]:
    """{instance name: its worker URL}, ``<scheme>://<host>:<port>`` (an IPv6 literal in brackets)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return {str(name): f"{scheme}://{host}:{port}" for name, port in ports.items()}


def _norm(url: Any) -> str:
    return str(url).rstrip("/")


def workers_of(answer: Answer | None) -> list[dict] | None:
    """The router's workers when the answer is one: a 200 whose JSON is an object with a list in
    ``workers`` (entries that are no object are left out); else None, which says nothing (a 5xx, a
    redirect, no JSON, workers missing or not a list)."""
    if answer is None or answer.status != 200:
        return None
    try:
        value = json.loads(answer.body)
    except ValueError:
        return None
    workers = value.get("workers") if isinstance(value, dict) else None
    if not isinstance(workers, list):
        return None
    return [w for w in workers if isinstance(w, dict)]


def seen(workers: list[dict] | None, wait_for: str, urls: list[str]) -> list[str]:
    """Which of the awaited worker URLs a poll saw: listed at all (wait_for ``gone``), or listed and
    healthy (``healthy``). A poll that was no answer (None) still lists every URL awaited gone, and
    none healthy."""
    if workers is None:
        return list(urls) if wait_for == "gone" else []
    listed = {_norm(w.get("url")): w for w in workers}
    if wait_for == "gone":
        return [u for u in urls if _norm(u) in listed]
    return [u for u in urls if listed.get(_norm(u), {}).get("is_healthy") is True]


def describe(answer: Answer | None, error: str = "") -> str:
    """The last answer as a message shows it: status and the router's text, escaped and cut."""
    if answer is None:
        return error or "no answer"
    if 300 <= answer.status < 400:
        to = f" to {safe_text(answer.location, EXCERPT)}" if answer.location else ""
        return f"HTTP {answer.status} (a redirect{to}, not followed)"
    text = safe_text(answer.body, EXCERPT)
    workers = workers_of(answer)
    if workers is not None:
        listing = ", ".join(f"{w.get('url')} ({'healthy' if w.get('is_healthy') is True else 'not healthy'})"
                            for w in workers)
        return f"HTTP 200, {len(workers)} workers" + (f": {safe_text(listing, EXCERPT)}" if workers else "")
    if answer.status == 200:
        return f"HTTP 200 without a JSON object with a list of workers ({text or 'empty body'})"
    return f"HTTP {answer.status}" + (f" ({text})" if text else "")


# ---------------------------------------------------------------------------------------------------
# The router's HTTP API
# ---------------------------------------------------------------------------------------------------


class RouterClient:
    """Requests to one router: a Bearer key, no redirect followed, at most max_bytes read, and each
    request ended at its deadline however slowly the router answers."""

    def __init__(self, url: str, api_key: str = "", timeout: float = REQUEST_TIMEOUT_S,
                 validate_certs: bool = True, max_bytes: int = MAX_BODY_BYTES) -> None:
        parts = urllib.parse.urlsplit(url)
        self.url = url.rstrip("/")
        self.scheme = parts.scheme
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.api_key = api_key
        self.timeout = timeout
        self.validate_certs = validate_certs
        self.max_bytes = max_bytes
        self.requests: list[str] = []

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            context = ssl.create_default_context()
            if not self.validate_certs:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=context)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Answer:
        """One request; its Answer, or a RouterError for no answer (not reached, cut at the deadline,
        more than max_bytes)."""
        timeout = max(min(timeout or self.timeout, self.timeout), 0.001)
        where = f"{method} {self.url}{path}"
        headers = {"Accept": "application/json", "User-Agent": "hicache-fleet-fleet-router"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        self.requests.append(f"{method} {path}")
        conn = self._connection(timeout)
        deadline = None
        try:
            conn.connect()
            deadline = _Deadline(conn, timeout)
            with deadline:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                if 300 <= resp.status < 400:
                    return Answer(resp.status, b"", resp.getheader("Location") or "")
                got = resp.read(self.max_bytes + 1)
            if len(got) > self.max_bytes:
                raise RouterError(f"{where} answered more than {self.max_bytes} bytes "
                                  f"({safe_text(got[:EXCERPT], 80)}); read no further: is rollout_router_url an "
                                  "sglang-router?")
            if deadline.expired:  # a body without a length ends at the shutdown, short and silent
                raise self._late(where, timeout)
            return Answer(resp.status, got)
        except (OSError, http.client.HTTPException) as exc:
            if deadline is not None and deadline.expired:
                raise self._late(where, timeout) from exc
            if isinstance(exc, (socket.timeout, TimeoutError)):
                raise RouterError(f"{where}: no answer within {timeout:g} s.") from exc
            raise RouterError(f"{where} failed: {type(exc).__name__}: {safe_text(exc, EXCERPT)}") from exc
        finally:
            conn.close()

    @staticmethod
    def _late(where: str, timeout: float) -> RouterError:
        return RouterError(f"{where}: no complete answer within {timeout:g} s (the deadline of the whole request; "
                           "a router that answers a byte at a time cannot hold the rollout longer).")


def list_workers(client: RouterClient) -> list[dict]:
    """GET /workers, which must answer; a RouterError saying what to check otherwise."""
    answer, error = None, ""
    try:
        answer = client.request("GET", "/workers")
    except RouterError as exc:
        error = str(exc)
    workers = workers_of(answer)
    if workers is None:
        raise RouterError(
            f"The router at rollout_router_url={client.url} did not list its workers from {socket.gethostname()} "
            f"(rollout_router_delegate_to): {describe(answer, error)}. Check that the router runs and is reachable "
            "from rollout_router_delegate_to, and rollout_router_api_key if it requires one; or set "
            "rollout_router_url to \"\" to roll out without a router.",
            status=answer.status if answer else None)
    return workers


def wait_for(client: RouterClient, wait_for_: str, urls: list[str], wait_s: float, poll_s: float,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> dict:
    """Poll GET /workers until none of urls is listed (``gone``) or all are listed healthy
    (``healthy``), within wait_s for every poll together. A RouterError naming what the router still
    lists and its last answer when the deadline passes."""
    deadline = clock() + wait_s
    polls = 0
    while True:
        polls += 1
        answer, error = None, ""
        try:
            answer = client.request("GET", "/workers", timeout=max(deadline - clock(), 0.001))
        except RouterError as exc:
            error = str(exc)
        now_seen = seen(workers_of(answer), wait_for_, urls)
        if (not now_seen) if wait_for_ == "gone" else len(now_seen) == len(urls):
            return {"polls": polls, "status": answer.status if answer else None}
        # The last poll keeps LAST_POLL_S of the deadline: one cut at once would say nothing.
        left = deadline - clock() - LAST_POLL_S
        if left <= 0:
            break
        sleep(min(poll_s, left))
    what = (f"still lists {', '.join(now_seen)}" if wait_for_ == "gone"
            else f"lists as healthy only [{', '.join(now_seen)}] of {', '.join(urls)}")
    raise RouterError(
        f"After {wait_s:g} s (rollout_router_wait_s) the router at {client.url} {what}. (Its last GET /workers, "
        f"poll {polls}: {describe(answer, error)}; only a 200 with a list of workers counts, a 5xx is never taken "
        "for gone.) See its GET /workers and its log.",
        status=answer.status if answer else None, polls=polls)


def _names(p: dict) -> list[str]:
    return list(p["names"]) if p.get("names") is not None else list((p.get("ports") or {}).keys())


def run(p: dict, check_mode: bool = False, clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep) -> dict:
    """The module's work for options p (already checked by check_params). Returns the result:
    changed, events, removed, added, workers (as first listed), urls ({name: worker URL}), status,
    msg. Raises RouterError (its result says what was done before the failure)."""
    client = RouterClient(p["url"], p.get("api_key") or "", p.get("timeout") or REQUEST_TIMEOUT_S,
                          p.get("validate_certs", True))
    urls = instance_urls(p.get("ports") or {}, p.get("worker_scheme") or "http", p.get("worker_host") or "")
    workers = list_workers(client)
    result: dict[str, Any] = {"changed": False, "events": [], "removed": [], "added": [], "workers": workers,
                              "urls": urls, "status": 200}
    state = p.get("state") or "read"
    if state == "read":
        result["msg"] = f"the router at {client.url} lists {len(workers)} workers"
        return result
    names = _names(p)
    wait_s, poll_s = p.get("wait_s") or 120, p.get("poll_interval") or POLL_INTERVAL_S
    if state == "out":
        wanted = {_norm(urls[n]) for n in names}
        out = [w for w in workers if _norm(w.get("url")) in wanted]
        gone = {_norm(w.get("url")) for w in out}
        leaving = [n for n in names if _norm(urls[n]) in gone]
        if not out:
            result["msg"] = f"the router lists none of {', '.join(names)}; nothing to take out"
            return result
        result["changed"] = True
        if check_mode:
            result["events"] = [f"would leave {w.get('url')}" for w in out]
            result["msg"] = "check mode: would take out " + ", ".join(leaving)
            return result
        for w in out:
            if w.get("id") in (None, ""):
                raise RouterError(f"The router at {client.url} lists {safe_text(w.get('url'), EXCERPT)} without an id, "
                                  "so it cannot be taken out (DELETE /workers/{id}); see its GET /workers.", **result)
            path = worker_url("", w["id"])
            try:
                answer = client.request("DELETE", path)
            except RouterError as exc:
                raise RouterError(f"{exc} The router at rollout_router_url={client.url} did not take "
                                  f"{w.get('url')} out.", **result) from exc
            if answer.status not in DELETE_OK:
                raise RouterError(f"DELETE {client.url}{path} (worker {safe_text(w.get('url'), EXCERPT)}) answered "
                                  f"{describe(answer)}; the router at rollout_router_url={client.url} did not take it "
                                  "out. See its log.", **{**result, "status": answer.status})
            result["events"].append(f"left {w.get('url')}")
        try:
            polls = wait_for(client, "gone", [w.get("url") for w in out], wait_s, poll_s, clock, sleep)
        except RouterError as exc:
            raise RouterError(str(exc), **{**result, **exc.result}) from exc
        result["status"] = polls["status"]
        grace = p.get("drain_grace_s") or 0
        if grace > 0:
            sleep(grace)
        result["removed"] = leaving
        result["msg"] = (f"took {', '.join(leaving)} out of the router after {polls['polls']} polls, then "
                         f"{grace} s for their requests in flight")
        return result
    # state in
    listed = {_norm(w.get("url")) for w in workers}
    in_urls = [urls[n] for n in names]
    missing = [n for n in names if _norm(urls[n]) not in listed]
    if not missing:
        result["msg"] = f"the router lists {', '.join(names)} already; nothing to add"
        return result
    result["changed"] = True
    if check_mode:
        result["events"] = [f"would join {urls[n]}" for n in missing]
        result["msg"] = "check mode: would add " + ", ".join(missing)
        return result
    for n in missing:
        try:
            answer = client.request("POST", "/workers", body={"url": urls[n]})
        except RouterError as exc:
            raise RouterError(f"{exc} The router at rollout_router_url={client.url} did not take {urls[n]}.",
                              **result) from exc
        if answer.status not in POST_OK:
            raise RouterError(f"POST {client.url}/workers (url {urls[n]}) answered {describe(answer)}; the router at "
                              f"rollout_router_url={client.url} did not add it. See its log.",
                              **{**result, "status": answer.status})
        result["added"].append(n)
        result["events"].append(f"joined {urls[n]}")
    try:
        polls = wait_for(client, "healthy", in_urls, wait_s, poll_s, clock, sleep)
    except RouterError as exc:
        raise RouterError(str(exc), **{**result, **exc.result}) from exc
    result["status"] = polls["status"]
    result["msg"] = f"added {', '.join(missing)} to the router; listed healthy after {polls['polls']} polls"
    return result
