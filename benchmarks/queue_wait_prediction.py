"""How close is the predicted queue wait to the actual one? (issue 40)

The real engine on the embedded model, in this process, with its slots forced low (4) so that
requests wait, under three load patterns:

- steady: 8 users in a closed loop (each sends its next chat when its last one ends), 5 rounds;
- burst: 12 long prompts (600-1,500 tokens) at once, behind 4 streams;
- heavy: one user with 8 chats at once among 4 light users, each light user's next chat 1 s
  after its last one ended.

Replies are sampled (temperature 0.8, max_tokens 24-160): their lengths vary as a chat's do.
Every request that waited for a prediction is kept: the wait its first prediction said (from
when it was made) against the wait it had from then. Prints, per pattern, the number of such
requests, the median absolute error as a share of the median actual wait (the issue's measure:
within 30%), the quartiles of the absolute error, and the median actual wait.

    .venv/bin/python benchmarks/queue_wait_prediction.py

Figures: docs/benchmarks.md, "Queue wait prediction (issue 40)".
"""

from __future__ import annotations

import platform
import random
import statistics
import time

import msgspec

from localserve.bench.scenario import LONG_EXPLANATIONS, SHORT_QUESTIONS, TOKENS_PER_WORD, pages_slice
from localserve.config import builtin_config
from localserve.engine.engine import Engine
from localserve.engine.events import Done
from localserve.engine.sampling_params import SamplingParams
from localserve.runners.models import open_runner

SLOTS = 4


class Load:
    """An engine driven step by step in this thread, with users who send when told."""

    def __init__(self, engine: Engine, runner, seed: int) -> None:
        self.engine, self.runner = engine, runner
        self.rng = random.Random(seed)
        self.done: list[Done] = []
        self.number = 0
        engine.on_events = self._events
        self.on_done = lambda done: None

    def _events(self, events) -> None:
        for e in events:
            if isinstance(e, Done):
                self.done.append(e)
                self.on_done(e)

    def send(self, user: str, text: str, max_tokens: int | None = None) -> str:
        self.number += 1
        rid = f"{user}-{self.number}"
        tokens = self.runner.tokenize(f"<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n")
        n = max_tokens or self.rng.randint(24, 160)
        params = SamplingParams(temperature=0.8, seed=self.number, max_tokens=n)
        self.engine.add_request(rid, tokens, params, user=user)
        return rid

    def run(self, until) -> None:
        while not until():
            self.engine.step()


def question(rng: random.Random) -> str:
    return rng.choice(SHORT_QUESTIONS + LONG_EXPLANATIONS)


def steady(load: Load) -> None:
    users = [f"u{i}" for i in range(8)]
    rounds = {u: 0 for u in users}
    pending = {load.send(u, question(load.rng)): u for u in users}

    def next_turn(done: Done) -> None:
        user = pending.pop(done.request_id, None)
        if user is not None and rounds[user] < 4:
            rounds[user] += 1
            pending[load.send(user, question(load.rng))] = user

    load.on_done = next_turn
    load.run(lambda: not pending)


def burst(load: Load) -> None:
    streams = [load.send(f"s{i}", LONG_EXPLANATIONS[i], 200) for i in range(4)]
    for _ in range(10):
        load.engine.step()
    rng = random.Random(1)
    pastes = []
    for i in range(12):
        words = round(rng.randint(600, 1500) / TOKENS_PER_WORD)
        pastes.append(load.send(f"p{i}", pages_slice(rng, words) + "\n\nSummarize this."))
    ids = set(streams + pastes)
    load.run(lambda: ids <= {d.request_id for d in load.done})


def heavy(load: Load) -> None:
    heavy_ids = {load.send("heavy", question(load.rng)) for _ in range(8)}
    light = {f"l{i}": 0 for i in range(4)}
    due: dict[str, float] = dict.fromkeys(light, time.perf_counter())
    pending: dict[str, str] = {}

    def finished(done: Done) -> None:
        user = pending.pop(done.request_id, None)
        if user is not None and light[user] < 4:
            due[user] = time.perf_counter() + 1.0

    load.on_done = finished

    def tick() -> bool:
        now = time.perf_counter()
        for user, at in list(due.items()):
            if now >= at:
                del due[user]
                light[user] += 1
                pending[load.send(user, question(load.rng))] = user
        ended = {d.request_id for d in load.done}
        return not due and not pending and heavy_ids <= ended

    load.run(tick)


def report(name: str, done: list[Done]) -> None:
    pairs = [
        (d.timings["predicted_queue_ms"] / 1e3, d.timings["queue_ms"] / 1e3)
        for d in done
        if d.timings.get("predicted_queue_ms") is not None and d.timings.get("queue_ms")
    ]
    if not pairs:
        print(f"{name}: nobody waited")
        return
    errors = sorted(abs(p - a) for p, a in pairs)
    actual = statistics.median(a for _, a in pairs)
    q1, q2, q3 = statistics.quantiles(errors, n=4) if len(errors) > 1 else errors * 3
    print(
        f"{name}: {len(pairs)} waited, median actual {actual:.2f} s; |error| quartiles "
        f"{q1:.2f} / {q2:.2f} / {q3:.2f} s; median |error| / median actual "
        f"{statistics.median(errors) / actual:.0%}; median |error| / actual per request "
        f"{statistics.median(abs(p - a) / a for p, a in pairs):.0%}"
    )


def main() -> None:
    config = builtin_config()
    name = config.default
    model = msgspec.structs.replace(config.models[name], max_num_seqs=SLOTS)
    config = msgspec.structs.replace(config, models={name: model})
    runner = open_runner(config)
    print(f"machine: {platform.processor() or platform.machine()}, {runner.info.backend}; "
          f"{SLOTS} slots, n_ctx {runner.info.n_ctx}")
    for pattern, seed in ((steady, 1), (burst, 2), (heavy, 3)):
        engine = Engine(runner, config.scheduler, clock=time.perf_counter)
        load = Load(engine, runner, seed)
        start = time.perf_counter()
        pattern(load)
        print(f"[{pattern.__name__}: {time.perf_counter() - start:.0f} s, {len(load.done)} requests]")
        report(pattern.__name__, load.done)


if __name__ == "__main__":
    main()
