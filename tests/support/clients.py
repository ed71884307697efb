"""The clients the hostile-client and transport tests share: bob, who streams whole replies the
whole time (Streamer); a plain HTTP request (http_request); and what a client checks of what it
sees. The hostile clients themselves (RawClient, Squatter, healthy_from) are
localserve/bench/hostile.py's, where the benchmarks use them too."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse


def http_request(server, method: str, path: str, body=None, headers: dict | None = None):
    """A plain HTTP request to a live server (its `.http` URL), JSON unless `body` is bytes:
    (status, headers, body bytes)."""
    url = urllib.parse.urlsplit(server.http)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request(method, path, data, {"Content-Type": "application/json"} | (headers or {}))
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, response.headers, payload


def ends_with_an_error(ws, within: float) -> dict:
    """A stream's `error` (unavailable) and then its `done`, within the bound: the error."""
    started = time.monotonic()
    frames = ws.until(lambda f: f["type"] in ("error", "done"), timeout=within)
    error = frames[-1]
    assert error["type"] == "error" and error["code"] == "unavailable", error
    done = ws.recv(timeout=30)
    assert done["type"] == "done" and done["finish_reason"] == "error", done
    assert time.monotonic() - started < within
    return error


class Streamer:
    """bob: one complete reply after another until stopped; every reply must be whole."""

    def __init__(self, server, tokens: int = 24) -> None:
        from localserve.bench.blocking_ws import WS

        self.tokens = tokens
        self.replies: list[dict] = []  # each reply's done frame
        self.problems: list[dict] = []
        self._stop = threading.Event()
        self._first_token = threading.Event()
        self._ws = WS(server.url)
        assert self._ws.hello("bob")["type"] == "welcome"
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._first_token.wait(60), "bob never got a token"

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            rid = f"bob{n}"
            self._ws.chat(rid, "Tell me about the sea.", max_tokens=self.tokens, ignore_eos=True)
            text = []
            for frame in self._ws.until_done(rid, timeout=180):
                if frame["type"] == "token":
                    text.append(frame["text"])
                    self._first_token.set()
                elif frame["type"] not in ("queued", "done"):
                    self.problems.append(frame)
            done = frame
            if done["finish_reason"] != "length" or not "".join(text):
                self.problems.append(done)
            self.replies.append(done)

    def finish(self) -> list[dict]:
        """Stop after the reply in flight; check that every reply was whole."""
        self._stop.set()
        self._thread.join(240)
        self._ws.close()
        assert not self._thread.is_alive(), "bob's reply never ended"
        assert not self.problems, self.problems
        assert self.replies and all(
            d["usage"]["completion_tokens"] == self.tokens for d in self.replies
        )
        return self.replies
