"""What operators ask the server: `GET /healthz` (load in totals, open to anyone) and
`GET /metrics` (Prometheus text, behind the monitor token like the stats frames).

/healthz answers within HEALTH_TIMEOUT_S whatever the engine does, and says what is wrong (the
engine not answering, an engine or usage-record problem, a people store that cannot record new
people, a shutdown) with a 503; the chat page
shows it as the server's status. A long step is no problem: the engine process answers from its
last snapshot with that step (`step`: what it carries, how long it has run, its limit), and the
step is a problem only once past its limit. /metrics, too, answers from the last snapshot of an
engine that has not answered within HEALTH_TIMEOUT_S.

Tested in tests/e2e/test_websocket_connection.py and tests/e2e/test_engine_faults.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable

import msgspec
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from localserve.ops import prometheus
from localserve.ops.auth import monitor_refusal
from localserve.ops.usage import Usage
from localserve.protocol.snapshot import ModelInfo
from localserve.serve.admission import Admission
from localserve.serve.snapshots import NoModelLoaded, Snapshots
from localserve.serve.transport import bearer_token, client_address

HEALTH_TIMEOUT_S = 2.0  # /healthz answers within this long, whatever the engine does


class Health:
    """The /healthz and /metrics endpoints."""

    def __init__(
        self,
        admission: Admission,
        snapshots: Snapshots,
        info: Callable[[], ModelInfo | None],
        usage: Callable[[], Usage | None],
        others: Callable[[], list[Snapshots]] = list,
    ) -> None:
        self.admission = admission
        self.snapshots = snapshots
        self._info = info  # the default model's (or, while it is unloaded, a loaded one's)
        self._usage = usage
        self._others = others  # the other loaded models' snapshots (for /metrics)

    @property
    def usage(self) -> Usage | None:
        """The usage record whose problems /healthz reports (the server's current one)."""
        return self._usage()

    def routes(self) -> list[Route]:
        return [Route("/healthz", self.healthz), Route("/metrics", self.metrics)]

    async def healthz(self, request: HttpRequest) -> Response:
        """Load in totals only (no user's requests): open to anyone, the chat page's status.
        Within HEALTH_TIMEOUT_S whatever the engine does: an engine that does not answer in
        that long is a problem, said with the last snapshot that came."""
        late = ""
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_S):
                snap = await self.snapshots.fetch()
        except NoModelLoaded:  # every model unloaded: nothing wrong, nothing running
            snap = None
        except TimeoutError:
            snap = self.snapshots.last
            late = f"the engine has not answered for {HEALTH_TIMEOUT_S:g} s"
        usage_problem = self.usage.problem if self.usage is not None else ""
        store = self.admission.people.store  # new people cannot be recorded: said here too
        people_problem = f"new people refused: {store.problem}" if store and store.problem else ""
        problems = [
            p for p in (late, snap and snap.engine_problem, usage_problem, people_problem) if p
        ]
        if self.admission.is_shutting_down:
            problems.insert(0, "shutting down")
        info = self._info()
        body = {
            "ok": not problems,
            "model": self.admission.pool.default,
            "backend": info.backend if info is not None else "",
            "tokens": self.admission.access.requires_tokens,
            "models": self.admission.describe_models(),  # every model's state (pool.py)
        }
        if snap is not None:
            body |= {
                "running": snap.running,
                "waiting": snap.waiting,
                "max_running": snap.max_num_seqs,
                "kv_used": snap.kv_used,
                "kv_cached": snap.kv_cached,
                "kv_total": snap.kv_total,
            }
        if snap is not None and snap.step is not None:  # the engine is busy in this step
            body["step"] = msgspec.structs.asdict(snap.step)
        if problems or (snap is not None and snap.workers):  # what is wrong; each worker
            body["problem"] = "; ".join(problems)
            body["workers"] = [msgspec.structs.asdict(w) for w in snap.workers] if snap else []
        if usage_problem:  # rows kept in memory, not on disk
            body["usage_problem"] = usage_problem
            body["usage_unwritten"] = self.usage.num_unwritten
        headers = {"Retry-After": "5"} if problems else None
        return JSONResponse(body, 503 if problems else 200, headers)

    async def _loaded_snapshots(self) -> list:
        """A snapshot of every loaded model, the primary's first (its engine's figures are the
        ones /healthz shows); each within HEALTH_TIMEOUT_S, else its last one; a model whose
        engine has never answered is left out."""
        snaps = []
        with contextlib.suppress(NoModelLoaded, TimeoutError):
            snaps.append(await self.snapshots.fetch_within(HEALTH_TIMEOUT_S))
        for source in self._others():
            with contextlib.suppress(Exception):
                snaps.append(await source.fetch_within(HEALTH_TIMEOUT_S))
        return snaps

    async def metrics(self, request: HttpRequest) -> Response:
        """/metrics follows the stats rule; the monitor token comes as a Bearer token."""
        admission = self.admission
        token = bearer_token(request)
        allowed = admission.access.allows_monitor(token)
        refused = await admission.authentication.authenticate(
            client_address(request.scope),
            "monitor",
            token,
            allowed,
            monitor_refusal("/metrics needs the monitor token (Bearer)", token),
        )
        if refused is not None:
            if refused.retry_after_s:
                wait = {"Retry-After": str(math.ceil(refused.retry_after_s))}
                return PlainTextResponse(refused.message + "\n", 429, wait)
            challenge = {"WWW-Authenticate": 'Bearer realm="localserve"'}
            return PlainTextResponse(refused.message + "\n", 401, challenge)
        t = admission.authentication.throttle
        snaps = await self._loaded_snapshots()
        models = [
            prometheus.ModelState(m["name"], m["state"], int((m["memory_mib"] or 0) * (1 << 20)))
            for m in admission.describe_models()
        ]
        text = prometheus.render(snaps, t.num_failures, t.num_throttled, models)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")
