"""The README's pictures of the chat page: a real server on the embedded model, a real browser.

    .venv/bin/python scripts/chat_screenshot.py [--out docs]

Someone else (bob, over the websocket) streams a long reply the whole time, so the status line
shows the load; alice, in headless Chromium, asks a question, reads the answer with its figures
and asks a follow-up, which is caught while it streams. Then the same on a phone-sized screen.
Needs Chromium (apt-get install chromium) and the test extras (Playwright).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import msgspec
from websockets.sync.client import connect

from localserve.config import load_config
from localserve.serve.serving import serving


def wait(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("chat_screenshot: timed out")
        time.sleep(0.05)


def shoot(browser, url: str, width: int, height: int, path: Path) -> None:
    """alice asks one thing, then in a new conversation another and a follow-up: the picture
    is taken while the follow-up streams."""
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.goto(url)
    page.fill("#signin-user", "alice")
    page.click("#signin-go")
    page.wait_for_selector("#input:not([disabled])")
    page.click("#settings-open")  # greedy: the same pictures every time
    page.fill("#set-temperature", "0")
    page.click("#settings-save")
    last = page.locator(".msg.assistant").last

    def answered() -> bool:
        return last.get_attribute("data-status") in ("done", "stopped", "error")

    for text in ["What is the capital of France? Tell me about it.", None, "Hello! Who are you?"]:
        if text is None:  # a second conversation
            page.click("#chats-toggle" if width < 720 else "#new-chat")
            if width < 720:
                page.click("#new-chat")
            continue
        page.fill("#input", text)
        page.press("#input", "Enter")
        wait(answered)
    page.fill("#input", "List the numbers from 1 to 50, one per line.")
    page.press("#input", "Enter")
    wait(lambda: len(last.inner_text()) > 60 or answered())
    page.screenshot(path=str(path))
    print(f"chat_screenshot: wrote {path}")
    context.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs", help="directory for chat.png, chat-phone.png")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        sys.exit("chat_screenshot: no Chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    out = Path(args.out)
    config = load_config(None)
    config.server = msgspec.structs.replace(config.server, usage=False)  # nobody's real usage
    with serving(config, thread=True) as served, sync_playwright() as p:
        bob = connect(served.thread.url)  # someone else, streaming the whole time
        bob.send(json.dumps({"type": "hello", "user": "bob"}))
        bob.recv()
        story = [{"role": "user", "content": "Tell me a long story about the sea."}]
        chat = {"type": "chat", "id": "b", "messages": story, "max_tokens": 4000}
        bob.send(json.dumps(chat | {"ignore_eos": True}))
        no_sandbox = ["--no-sandbox"] if os.geteuid() == 0 else []
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=no_sandbox)
        url = served.thread.http + "/"
        shoot(browser, url, 1100, 680, out / "chat.png")
        shoot(browser, url, 390, 780, out / "chat-phone.png")
        browser.close()
        bob.close()


if __name__ == "__main__":
    main()
