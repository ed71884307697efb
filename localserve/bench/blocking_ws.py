"""A blocking websocket client speaking JSON dicts, one frame at a time: what a benchmark (and a
test) says to a live or fake server with, in the order it wants, from a plain thread.

Tested in tests/e2e/test_fake_runner_server.py and tests/e2e/test_websocket_server.py.
"""

from __future__ import annotations


class WS:
    """A blocking test client speaking JSON dicts."""

    def __init__(self, url: str) -> None:
        from websockets.sync.client import connect

        # frames are read as they come and kept until asked for (max_queue=None): a client that
        # has not asked for the rest of a long reply still closes at once, where a paused
        # reader would hold the closing handshake for its close_timeout (10 s)
        self.ws = connect(url, max_size=None, max_queue=None, legacy=True)

    def send(self, frame) -> None:
        import json

        self.ws.send(frame if isinstance(frame, str | bytes) else json.dumps(frame))

    def recv(self, timeout: float = 30.0) -> dict:
        import json

        return json.loads(self.ws.recv(timeout))

    def hello(self, user: str, token: str | None = None) -> dict:
        self.send({"type": "hello", "user": user, "token": token})
        return self.recv()

    def chat(self, rid: str, text: str, **kw) -> None:
        frame = {"type": "chat", "id": rid, "messages": [{"role": "user", "content": text}]}
        self.send(frame | {"temperature": 0} | kw)

    def until(self, predicate, timeout: float = 60.0) -> list[dict]:
        """Frames up to and including the first that satisfies the predicate."""
        frames = []
        while True:
            frames.append(self.recv(timeout))
            if predicate(frames[-1]):
                return frames

    def until_done(self, rid: str, timeout: float = 60.0) -> list[dict]:
        return self.until(lambda f: f["type"] == "done" and f["id"] == rid, timeout)

    def close(self) -> None:
        self.ws.close()
