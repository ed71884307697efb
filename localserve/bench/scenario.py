"""Four people share one server: the scenario localserve was built for, played over websockets.

One round, every person on their own connection:

- ana asks short questions (40-60 tokens), one every few seconds, each after the last answer;
- ben asks for a long explanation (300-400 tokens, `ignore_eos`, so it really is long);
- cleo pastes a few pages of `data/pages.md` (2,000-3,000 tokens) and asks for a summary, then
  asks a follow-up in the same conversation (the server reuses the paste's cached cells);
- dev arrives a few seconds after the paste, while all of that still runs, with a medium question.

Rounds repeat, separated by a short rest, until `stop` is set (or `rounds` are done). Prompts,
pauses, output lengths and the pasted slice vary per round, drawn from `random.Random(seed)`
when the round is planned, so a seed always plays the same rounds. `pace` scales every pause;
`scale` scales every output length. Error frames (`busy`, `too_long`, ...) are counted and
logged and the person backs off; a closed connection quietly ends that person's part.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import importlib.resources
import logging
import random
from collections import Counter
from dataclasses import dataclass, field

from localserve.protocol.frames import Chat, Error, Finished, Message, Notice, TokenDelta
from localserve.websocket_client import Client, ConnectionClosed, chat

log = logging.getLogger("localserve.bench.scenario")

PEOPLE = ("ana", "ben", "cleo", "dev")
TEMPERATURE = 0.7
TOKENS_PER_WORD = 1.15  # Gemma 3's tokenizer on pages.md: 4,049 tokens for 3,502 words
BACKOFF_S = 5.0  # pause after an error frame (times pace)

SHORT_QUESTIONS = [
    "What is the capital of Australia?",
    "How many legs does a spider have?",
    "What colour do you get by mixing blue and yellow?",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water in Fahrenheit?",
    "How many minutes are there in a day?",
    "What is the largest planet in the solar system?",
    "Which gas do plants take in from the air?",
    "What is the opposite of generous?",
    "How many sides does a hexagon have?",
]

LONG_EXPLANATIONS = [
    "Explain in detail how a steam engine turns heat into motion, from the boiler to the wheels.",
    "Explain step by step how bread dough rises and what happens to it in the oven.",
    "Give a long, careful explanation of how the heart pumps blood around the body.",
    "Explain in depth how a bill becomes a law in a parliamentary democracy.",
    "Explain thoroughly how rain forms, from evaporation over the sea to a storm over land.",
    "Describe in detail how a computer runs a program, from the keyboard to the screen.",
]

MEDIUM_QUESTIONS = [
    "What are the main differences between a violin and a cello?",
    "Why do we have seasons, and why are they reversed in the southern hemisphere?",
    "What should I think about before adopting a dog?",
    "How do vaccines help the body fight an infection?",
    "What makes a good first bicycle for a child?",
    "Why does the moon look different over the course of a month?",
]

FOLLOW_UPS = [
    "Which part of it matters most, and why?",
    "Is there anything in those pages I should double-check?",
    "Explain the first paragraph again in simpler words.",
    "What would be a good title for it?",
]

SUMMARY_REQUESTS = [
    "Please summarise the pages above in a few sentences.",
    "What are the main points of this text? Keep it short.",
    "Give me a brief summary of what I just pasted.",
    "Summarise this for someone who has no time to read it.",
]


@dataclass(frozen=True)
class Ask:
    """One chat a person will send."""

    pause: float  # seconds (at pace 1.0) before sending: since their last answer or round start
    prompt: str
    max_tokens: int
    seed: int
    ignore_eos: bool = False
    continues: bool = False  # a next turn: sent with the person's previous chat and its reply


@dataclass(frozen=True)
class Round:
    asks: dict[str, list[Ask]]  # person -> their chats, in order
    rest: float  # seconds (at pace 1.0) before the next round


@dataclass
class ScenarioResult:
    rounds: int = 0  # rounds played to the end
    sent: int = 0
    finished: Counter[str] = field(default_factory=Counter)  # finish_reason -> requests
    errors: Counter[str] = field(default_factory=Counter)  # error code -> requests
    answered: Counter[str] = field(default_factory=Counter)  # person -> done frames
    prompt_tokens: dict[str, int] = field(default_factory=dict)  # person -> longest prompt
    cached_tokens: dict[str, int] = field(default_factory=dict)  # person -> most tokens reused


# --- planning (all randomness is here) -------------------------------------------------------


@functools.cache
def pages() -> list[str]:
    """pages.md as paragraphs (headings included)."""
    text = (importlib.resources.files("localserve.bench") / "data" / "pages.md").read_text("utf-8")
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def pages_slice(rng: random.Random, words: int) -> str:
    """Consecutive paragraphs of pages.md, from a random start, of at least `words` words."""
    paragraphs = pages()
    sizes = [len(p.split()) for p in paragraphs]
    starts = [i for i in range(len(paragraphs)) if sum(sizes[i:]) >= words] or [0]
    start = rng.choice(starts)
    end = start
    while end < len(paragraphs) and sum(sizes[start:end]) < words:
        end += 1
    return "\n\n".join(paragraphs[start:end])


def plan_round(rng: random.Random, scale: float = 1.0) -> Round:
    """Who asks what, when and for how long, for one round."""
    paste = _paste(rng)
    cleo = [paste, _follow_up(rng)]
    asks = {"ana": _short(rng), "ben": [_long(rng)], "cleo": cleo, "dev": [_medium(rng, paste)]}
    scaled = {name: [_scaled(a, scale) for a in chats] for name, chats in asks.items()}
    return Round(scaled, rest=rng.uniform(3, 8))


def _scaled(ask: Ask, scale: float) -> Ask:
    return dataclasses.replace(ask, max_tokens=max(1, round(ask.max_tokens * scale)))


def _short(rng: random.Random) -> list[Ask]:
    questions = rng.sample(SHORT_QUESTIONS, rng.randint(3, 5))
    pauses = [rng.uniform(0, 1)] + [rng.uniform(2, 5) for _ in questions[1:]]
    return [_ask(rng, p, q, rng.randint(40, 60)) for p, q in zip(pauses, questions, strict=True)]


def _long(rng: random.Random) -> Ask:
    prompt = rng.choice(LONG_EXPLANATIONS)
    return _ask(rng, rng.uniform(0, 1.5), prompt, rng.randint(300, 400), ignore_eos=True)


def _paste(rng: random.Random) -> Ask:
    text = pages_slice(rng, round(rng.randint(2000, 3000) / TOKENS_PER_WORD))
    prompt = f"{text}\n\n{rng.choice(SUMMARY_REQUESTS)}"
    return _ask(rng, rng.uniform(1, 3), prompt, rng.randint(80, 120))


def _follow_up(rng: random.Random) -> Ask:
    question = rng.choice(FOLLOW_UPS)
    return _ask(rng, rng.uniform(2, 5), question, rng.randint(60, 100), continues=True)


def _medium(rng: random.Random, paste: Ask) -> Ask:
    pause = paste.pause + rng.uniform(2, 5)  # dev arrives a few seconds after the paste
    return _ask(rng, pause, rng.choice(MEDIUM_QUESTIONS), rng.randint(120, 200))


def _ask(rng: random.Random, pause: float, prompt: str, max_tokens: int, **kw) -> Ask:
    return Ask(pause, prompt, max_tokens, seed=rng.randrange(1 << 31), **kw)


# --- playing ---------------------------------------------------------------------------------


@dataclass
class Person:
    """One person on one connection."""

    name: str
    client: Client
    result: ScenarioResult
    pace: float
    is_gone: bool = False  # the connection closed
    count: int = 0
    history: list[Message] = field(default_factory=list)  # the last chat and its reply

    async def play(self, asks: list[Ask]) -> None:
        """This person's part of a round."""
        if self.is_gone:
            return
        try:
            for ask in asks:
                await asyncio.sleep(ask.pause * self.pace)
                await self.chat(ask)
        except ConnectionClosed:
            log.info("%s: connection closed", self.name)
            self.is_gone = True

    async def chat(self, ask: Ask) -> None:
        """Send one chat and read frames until its done frame (or its error, then back off)."""
        self.count += 1
        rid = f"{self.name}-{self.count}"
        messages = (self.history if ask.continues else []) + [Message("user", ask.prompt)]
        request = Chat(
            id=rid,
            messages=messages,
            max_tokens=ask.max_tokens,
            temperature=TEMPERATURE,
            seed=ask.seed,
            ignore_eos=ask.ignore_eos,
        )
        reply: list[str] = []
        failed = False
        self.result.sent += 1
        async with contextlib.aclosing(chat(self.client, request)) as frames:
            async for frame in frames:
                if isinstance(frame, TokenDelta):
                    reply.append(frame.text)
                elif isinstance(frame, Finished):
                    self._done(frame)
                    self.history = [*messages, Message("assistant", "".join(reply))]
                elif isinstance(frame, Error):
                    log.warning("%s: %s: %s", self.name, frame.code, frame.message)
                    if failed := frame.id == rid:  # `internal` too: not waiting for its done
                        self.result.errors[frame.code] += 1
                        break
                elif isinstance(frame, Notice):
                    log.info("%s: notice %s: %s", self.name, frame.code, frame.message)
        if failed:
            await asyncio.sleep(BACKOFF_S * self.pace)

    def _done(self, done: Finished) -> None:
        r, usage = self.result, done.usage
        r.finished[done.finish_reason] += 1
        r.answered[self.name] += 1
        r.prompt_tokens[self.name] = max(r.prompt_tokens.get(self.name, 0), usage.prompt_tokens)
        r.cached_tokens[self.name] = max(r.cached_tokens.get(self.name, 0), usage.cached_tokens)
        ttft = done.timings.ttft_ms and round(done.timings.ttft_ms)
        log.info(
            "%s: %s, %d prompt (%d reused) + %d generated tokens, TTFT %s ms",
            self.name,
            done.finish_reason,
            usage.prompt_tokens,
            usage.cached_tokens,
            usage.completion_tokens,
            ttft,
        )


async def play(
    url: str,
    stop: asyncio.Event,
    seed: int = 0,
    rounds: int | None = None,
    pace: float = 1.0,
    *,
    scale: float = 1.0,
) -> ScenarioResult:
    """Play rounds against the server at `url` until `stop` is set or `rounds` are done."""
    result = ScenarioResult()
    rounds_task = asyncio.create_task(_play_rounds(url, result, seed, rounds, pace, scale))
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({rounds_task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # closing the connections makes the server cancel what they still had running
        stopped.cancel()
        if not rounds_task.done():
            rounds_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await rounds_task
    if not rounds_task.cancelled():
        rounds_task.result()  # re-raise what went wrong, if anything did
    return result


async def _play_rounds(
    url: str, result: ScenarioResult, seed: int, rounds: int | None, pace: float, scale: float
) -> None:
    rng = random.Random(seed)
    async with contextlib.AsyncExitStack() as stack:
        people = []
        for name in PEOPLE:
            client = await stack.enter_async_context(await Client.connect(url, name))
            people.append(Person(name, client, result, pace))
        while rounds is None or result.rounds < rounds:
            plan = plan_round(rng, scale)
            await asyncio.gather(*(p.play(plan.asks[p.name]) for p in people))
            if all(p.is_gone for p in people):
                return
            result.rounds += 1
            if rounds is None or result.rounds < rounds:
                await asyncio.sleep(plan.rest * pace)


def main() -> None:
    """`python -m localserve.bench.scenario [URL] [SEED]`: play until Ctrl-C, logging every
    answer."""
    import signal
    import sys

    async def run() -> ScenarioResult:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
        url = sys.argv[1] if len(sys.argv) > 1 else "ws://127.0.0.1:8765"
        return await play(url, stop, seed=int(sys.argv[2]) if len(sys.argv) > 2 else 0)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    print(asyncio.run(run()))


if __name__ == "__main__":
    main()
