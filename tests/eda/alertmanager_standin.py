"""A stand-in for the `ansible.eda` collection's `alertmanager` event source, for the tests only.

The collection is not on any registry this project reaches (PyPI, Debian, npm): tests/eda installs
this file as `ansible_collections/ansible/eda/extensions/eda/plugins/event_source/alertmanager.py`
in a temporary collections path, so that ansible-rulebook (the real one) runs the shipped rulebook
unchanged. It does what the collection documents for the options the rulebook sets: an HTTP
server on `host`:`port` taking Alertmanager's webhook POST on `/{endpoint}`; one event per item of
`data_alerts_path` (`alerts`), `{"alert": <item>, "meta": {"endpoint", "headers", "hosts"}}`, whose
`meta.hosts` is the value at `data_host_path` (a `:port` cut off); with `skip_original_data` false,
the whole notification first as `{"payload": ..., "meta": ...}`. It is not the collection's code:
a difference from the real plugin is not caught here (docs/event-driven.md, "What is proven").
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web


def _get(data: Any, path: str, separator: str) -> Any:
    for key in path.split(separator):
        if not isinstance(data, dict) or key not in data:
            raise KeyError(path)
        data = data[key]
    return data


async def main(queue: asyncio.Queue, args: dict[str, Any]) -> None:
    alerts_path = str(args.get("data_alerts_path", "alerts"))
    host_path = str(args.get("data_host_path", "labels.instance"))
    separator = str(args.get("data_path_separator", "."))
    skip_original = bool(args.get("skip_original_data", False))

    async def webhook(request: web.Request) -> web.Response:
        payload = await request.json()
        meta = {"endpoint": request.match_info["endpoint"], "headers": dict(request.headers)}
        if not skip_original:
            await queue.put({"payload": payload, "meta": meta})
        try:
            alerts = _get(payload, alerts_path, separator) if alerts_path else [payload]
        except KeyError:
            alerts = []
        for alert in alerts if isinstance(alerts, list) else [alerts]:
            hosts = []
            if host_path:
                try:
                    hosts.append(str(_get(alert, host_path, separator)).split(":")[0])
                except KeyError:
                    pass
            await queue.put({"alert": alert, "meta": {**meta, "hosts": hosts}})
        return web.Response(status=202, text="Received")

    async def status(_request: web.Request) -> web.Response:
        return web.Response(text="up")

    app = web.Application()
    app.add_routes([web.get("/", status), web.post("/{endpoint}", webhook)])
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, args.get("host", "localhost"), int(args.get("port", 5000))).start()
    try:
        await asyncio.Future()
    finally:
        await runner.cleanup()
