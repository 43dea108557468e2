"""A package index on 127.0.0.0/8 that answers only with HTTP basic auth, for the venv tests.

    python basic_auth_index.py ADDRESS WHEEL_DIR LOG   (stdin: USER, then PASSWORD, one a line)

Serves PEP 503's simple API from the wheels in WHEEL_DIR (``/idx/<name>/`` lists them, ``/files/<wheel>``
serves one) to a request whose Authorization header is ``Basic base64(USER:PASSWORD)``; anything else
gets 401 with a challenge. Binds ADDRESS on a free port, prints the port on its first line, and appends
``<status> <path>`` per request to LOG (never a header). The account comes on stdin, so that no
process's command line holds the password (the tests watch every one). Runs until the test stops it
by its PID.
"""

from __future__ import annotations

import base64
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(address: str, wheel_dir: str, log: str) -> None:
    user, password = sys.stdin.readline().rstrip("\n"), sys.stdin.readline().rstrip("\n")
    wheels = {path.name: path for path in Path(wheel_dir).glob("*.whl")}
    expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return

        def answer(self, status: int, body: bytes = b"", kind: str = "text/html") -> None:
            with open(log, "a", encoding="utf-8") as out:
                out.write(f"{status} {self.path}\n")
            self.send_response(status)
            if status == 401:
                self.send_header("WWW-Authenticate", 'Basic realm="test index"')
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.headers.get("Authorization") != expected:
                self.answer(401)
                return
            parts = [part for part in self.path.split("?")[0].split("/") if part]
            if len(parts) == 2 and parts[0] == "idx":
                links = [f'<a href="/files/{name}">{name}</a>' for name in sorted(wheels)
                         if canonical(name.split("-")[0]) == canonical(parts[1])]
                if links:
                    self.answer(200, ("<html><body>" + "".join(links) + "</body></html>").encode())
                    return
            if len(parts) == 2 and parts[0] == "files" and parts[1] in wheels:
                self.answer(200, wheels[parts[1]].read_bytes(), "application/octet-stream")
                return
            self.answer(404)

    server = ThreadingHTTPServer((address, 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(*sys.argv[1:4])
