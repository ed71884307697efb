"""How much later is a short question's first token while a paste is prefilled? (issue 14)

Ten short questions on an idle server, then ten more while three people stream and a
3,000-token paste is prefilled: the origin scenario's late question, ten times instead of once.
Against a server already running (a fresh one: prefix reuse would serve the repeats):

    localserve serve --port 8765 &
    .venv/bin/python benchmarks/late_question_ttft.py [ws://127.0.0.1:8765]

Prints, per late question, its client TTFT and the server's queue time and TTFT; then the
paste's TTFT, the idle and late TTFTs with their medians, and late / idle.
Figures: docs/benchmarks.md, "Performance, round two (issue 14)", goal 2.
"""

import asyncio
import random
import statistics
import sys
import time

from localserve.bench.workloads import (
    LONG_EXPLANATIONS,
    SHORT_QUESTIONS,
    SUMMARY_REQUESTS,
    TOKENS_PER_WORD,
    pages_slice,
)
from localserve.websocket_client import Client, chat
from localserve.protocol.frames import Chat, Finished, Message, TokenDelta

URL = sys.argv[1] if len(sys.argv) > 1 else "ws://127.0.0.1:8765"


async def ask(user: str, text: str, max_tokens: int, report: bool = False) -> float:
    client = await Client.connect(URL, user)
    request = Chat(
        id="x", messages=[Message("user", text)], max_tokens=max_tokens, temperature=0,
        ignore_eos=True,
    )
    start, first = time.perf_counter(), None
    async for frame in chat(client, request):
        if isinstance(frame, TokenDelta) and first is None:
            first = time.perf_counter() - start
        if isinstance(frame, Finished) and report:
            t = frame.timings
            print(f"{user}: client TTFT {first * 1e3:.0f} ms; server: queue {t.queue_ms:.0f} ms, "
                  f"TTFT {t.ttft_ms:.0f} ms")
    await client.close()
    return first


async def main() -> None:
    idle = [await ask(f"idle{i}", SHORT_QUESTIONS[i % 5], 4) for i in range(10)]
    streams = [asyncio.create_task(ask(f"s{i}", LONG_EXPLANATIONS[i], 400)) for i in range(3)]
    await asyncio.sleep(4)  # everyone is streaming
    text = pages_slice(random.Random(0), round(3000 / TOKENS_PER_WORD))
    paste = asyncio.create_task(ask("paster", f"{text}\n\n{SUMMARY_REQUESTS[0]}", 8))
    await asyncio.sleep(0.5)
    late = []
    for i in range(10):
        late.append(await ask(f"late{i}", SHORT_QUESTIONS[i % 5], 4, report=True))
        await asyncio.sleep(0.13 * (i % 3))  # vary the phase against the steps
    print(f"paste TTFT {await paste * 1e3:.0f} ms")
    for s in streams:
        s.cancel()
    for name, values in (("idle", idle), ("late", late)):
        print(f"{name}: {[round(v * 1e3) for v in values]} median "
              f"{statistics.median(values) * 1e3:.0f} ms")
    print(f"late / idle (medians): {statistics.median(late) / statistics.median(idle):.2f}")


asyncio.run(main())
