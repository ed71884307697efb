"""A stand-in for the Hugging Face Hub on loopback, serving what huggingface_hub 2.x asks for:
`GET /api/models/ORG/REPO?blobs=True` (siblings with size and LFS sha256) and
`HEAD/GET /ORG/REPO/resolve/REV/FILE` with the headers hf_hub_download reads (ETag,
X-Repo-Commit, X-Linked-Etag, X-Linked-Size, Content-Length) and Range requests. Faults:
`drop_after` bytes (the first GET of a file stops there, the connection closed) and `corrupt`
(the file's bytes served with one byte changed)."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, Path]]) -> None:
        self.repos = repos
        self.sha = {
            (r, n): hashlib.sha256(p.read_bytes()).hexdigest()
            for r, files in repos.items()
            for n, p in files.items()
        }
        self.drop_after: int | None = None
        self.corrupt = False
        self.ranges: list[str] = []  # Range headers seen on file GETs
        self.authorizations: list[str] = []  # Authorization headers seen (HF_TOKEN)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                hub._serve(self, body=True)

            def do_HEAD(self) -> None:
                hub._serve(self, body=False)

        return Handler

    def _serve(self, h, body: bool) -> None:
        path = unquote(urlparse(h.path).path)
        self.authorizations.append(h.headers.get("Authorization", ""))
        if path.startswith("/api/models/"):
            return self._info(h, path.removeprefix("/api/models/"))
        parts = path.strip("/").split("/")
        repo, rest = "/".join(parts[:2]), parts[2:]
        if len(rest) < 3 or rest[0] != "resolve" or repo not in self.repos:
            return self._error(h, 404, "RepoNotFound")
        name = "/".join(rest[2:])
        if name not in self.repos[repo]:
            return self._error(h, 404, "EntryNotFound")
        self._file(h, repo, name, body)

    def _info(self, h, repo: str) -> None:
        if repo not in self.repos:
            return self._error(h, 404, "RepoNotFound")
        siblings = [
            {
                "rfilename": n,
                "size": p.stat().st_size,
                "lfs": {"size": p.stat().st_size, "sha256": self.sha[repo, n], "pointerSize": 134},
            }
            for n, p in self.repos[repo].items()
        ]
        siblings.append({"rfilename": "README.md", "size": 10})
        data = json.dumps({"id": repo, "modelId": repo, "sha": COMMIT, "siblings": siblings})
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data.encode())

    def _file(self, h, repo: str, name: str, body: bool) -> None:
        data = self.repos[repo][name].read_bytes()
        if self.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 1])
        start, status = 0, 200
        rng = h.headers.get("Range")
        if body:
            self.ranges.append(rng or "")
        if rng and rng.startswith("bytes="):
            first, _, last = rng[6:].partition("-")
            start = int(first)
            end = int(last) + 1 if last else len(data)
            data, status = data[start:end], 206
            full = len(self.repos[repo][name].read_bytes())
        h.send_response(status)
        etag = f'"{self.sha[repo, name]}"'
        size = self.repos[repo][name].stat().st_size
        for k, v in (
            ("ETag", etag),
            ("X-Linked-Etag", etag),
            ("X-Linked-Size", str(size)),
            ("X-Repo-Commit", COMMIT),
            ("Accept-Ranges", "bytes"),
            ("Content-Length", str(len(data))),
        ):
            h.send_header(k, v)
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{start + len(data) - 1}/{full}")
        h.end_headers()
        if not body:
            return
        if self.drop_after is not None and not rng:
            h.wfile.write(data[: self.drop_after])
            self.drop_after = None
            h.close_connection = True
            return
        h.wfile.write(data)

    def _error(self, h, status: int, code: str) -> None:
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", code)
        h.send_header("Content-Length", "0")
        h.end_headers()
