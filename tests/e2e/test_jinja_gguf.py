"""A GGUF carrying a Jinja chat template (the embedded model with Gemma 3's instruction template
written into its `tokenizer.chat_template`) loads and serves through the real server: its prompts
are the Jinja rendering, made in the server's process (engine_process.VocabOnly) and in the
engine's (LlamaRunner)."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from localserve.bench.blocking_ws import WS
from localserve.chat.templates import ChatTemplate
from localserve.config import Config, ModelConfig, ServerConfig
from localserve.runners.models import ensure_embedded
from tests.support.paths import templated_gguf

pytestmark = pytest.mark.model

TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "templates" / "google-gemma-3-4b-it.jinja"
CHAT = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture(scope="session")
def jinja_gguf(tmp_path_factory) -> Path:
    """A copy of the embedded GGUF with the template in its metadata (written once, kept)."""
    return templated_gguf(TEMPLATE)


def jinja_config(path: Path, engine_process: bool) -> Config:
    model = ModelConfig(
        path=str(path), n_ctx=2048, max_num_seqs=4, max_num_batched_tokens=256, n_threads=2
    )
    server = ServerConfig(shutdown_grace_s=2, engine_process=engine_process)
    return Config(default="gemma-jinja", models={"gemma-jinja": model}, server=server)


@pytest.mark.parametrize("engine_process", [True, False], ids=["engine-process", "in-process"])
def test_a_gguf_with_a_jinja_template_serves_its_rendering(jinja_gguf, engine_process):
    from localserve.serve.serving import serving

    with serving(jinja_config(jinja_gguf, engine_process), thread=True) as served:
        runner = served.server.runner
        expected = ChatTemplate(TEMPLATE.read_text(encoding="utf-8"), "<bos>", "<eos>").render(CHAT)
        assert expected.startswith("<bos><start_of_turn>user\nAnswer briefly.\n\nWhat is")
        # the runner renders the GGUF's template; the tokenizer adds the BOS the text then drops
        assert runner.apply_chat_template(CHAT) == expected.removeprefix("<bos>")
        assert runner.info.chat_template == TEMPLATE.read_text(encoding="utf-8")
        tokens = runner.tokenize(expected, add_special=False)
        client = openai.OpenAI(base_url=served.thread.http + "/v1", api_key="-", max_retries=0)
        reply = client.chat.completions.create(
            model="gemma-jinja", messages=CHAT, max_tokens=4, temperature=0
        )
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert reply.usage.prompt_tokens == len(tokens)
        # the template's own refusal is this request's 400, and the server serves on
        with pytest.raises(openai.BadRequestError, match="Conversation roles must alternate"):
            client.chat.completions.create(
                model="gemma-jinja", messages=[*CHAT, CHAT[1]], max_tokens=4
            )
        again = client.chat.completions.create(model="gemma-jinja", messages=CHAT, max_tokens=2)
        assert again.usage.prompt_tokens == len(tokens)


HOSTILE = (  # fine for one message; for two, 10^10 empty loop turns
    "{% if messages | length > 1 %}{% for i in range(100000) %}{% for j in range(100000) %}"
    "{% endfor %}{% endfor %}{% endif %}{% for m in messages %}<start_of_turn>{{ m.role }}\n"
    "{{ m.content }}<end_of_turn>\n{% endfor %}<start_of_turn>model\n"
)


def test_a_hostile_template_file_fails_its_request_and_nothing_else(tmp_path):
    import threading
    import time
    import urllib.request

    from localserve.config import load_config
    from localserve.serve.serving import serving

    (tmp_path / "hostile.jinja").write_text(HOSTILE, encoding="utf-8")
    (tmp_path / "models.toml").write_text(
        '[models.g]\nembedded = true\nchat_template = "hostile.jinja"\nn_ctx = 2048\n'
        "n_threads = 2\nmax_num_batched_tokens = 256\nmax_num_seqs = 4\n"
        "[server]\nshutdown_grace_s = 2\nengine_process = false\n",
        encoding="utf-8",
    )
    config = load_config(tmp_path / "models.toml")
    config.default = "g"
    with serving(config, thread=True) as served:
        http = served.thread.http
        client = openai.OpenAI(base_url=http + "/v1", api_key="-", max_retries=0)
        one = client.chat.completions.create(model="g", messages=CHAT[1:], max_tokens=2)
        assert one.usage.prompt_tokens > 5
        failed: list[Exception] = []

        def hostile() -> None:
            try:
                client.chat.completions.create(model="g", messages=CHAT, max_tokens=2)
            except openai.BadRequestError as e:
                failed.append(e)

        def health_s() -> float:
            tick = time.monotonic()
            with urllib.request.urlopen(http + "/healthz", timeout=30) as answer:
                assert answer.status == 200
            return time.monotonic() - tick

        control = max(health_s() for _ in range(3))  # here and now, nothing rendering
        started = time.monotonic()
        thread = threading.Thread(target=hostile)
        thread.start()
        time.sleep(0.3)  # the render is under way on a tokenizer thread (for up to 2 s)
        # the event loop is not stalled: a stall would hold /healthz for the render's rest
        assert health_s() < 3 * control + 1.0, control
        thread.join(timeout=60)
        assert time.monotonic() - started < 30
        assert len(failed) == 1 and "chat_template" in str(failed[0])
        assert "too much work" in str(failed[0]) or "took over" in str(failed[0])
        again = client.chat.completions.create(model="g", messages=CHAT[1:], max_tokens=2)
        assert again.usage.prompt_tokens == one.usage.prompt_tokens
        # the same over the websocket protocol: that chat's bad_request, the connection open
        ws = WS(served.thread.url)
        try:
            ws.hello("alice")
            ws.send({"type": "chat", "id": "h", "messages": CHAT, "max_tokens": 2})
            error = ws.until(lambda f: f["type"] == "error", timeout=30)[-1]
            assert (error["code"], error["id"]) == ("bad_request", "h")
            assert error["message"].startswith("chat_template: the template ")
            ws.chat("ok", "Hi", max_tokens=2)
            assert ws.until_done("ok")[-1]["type"] == "done"
        finally:
            ws.close()


def vocab(path: Path, **cfg):
    from localserve.runners.llama_text import VocabOnly

    return VocabOnly(path, ModelConfig(path=str(path), **cfg))


def test_the_template_source_is_chosen_as_models_toml_says(tmp_path, jinja_gguf):
    embedded = ensure_embedded()
    none = vocab(embedded)  # the embedded GGUF carries no template
    with pytest.raises(ValueError, match="chat_template: the model has none"):
        none.apply_chat_template(CHAT)
    builtin = vocab(jinja_gguf, chat_template="gemma")  # a name beats the file's Jinja
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    assert builtin.apply_chat_template(parts) == "<start_of_turn>user\nHi<end_of_turn>\n" + (
        "<start_of_turn>model\n"
    )
    with pytest.raises(ValueError, match="built-in chat template 'gemma' cannot show tools"):
        builtin.apply_chat_template(CHAT, tools=[{"type": "function", "function": {"name": "f"}}])
    (tmp_path / "t.jinja").write_text("{{ bos_token }}[{{ messages[-1].content }}|{{ x }}]")
    own = vocab(embedded, chat_template=str(tmp_path / "t.jinja"))
    assert own.apply_chat_template(CHAT, x=1) == "[What is the capital of France?|1]"  # no <bos>
    (tmp_path / "bad.jinja").write_text("{% for %}")
    with pytest.raises(ValueError, match="chat_template: the template is not valid Jinja"):
        vocab(embedded, chat_template=str(tmp_path / "bad.jinja")).apply_chat_template(CHAT)
    for v in (none, builtin, own):
        v.close()
