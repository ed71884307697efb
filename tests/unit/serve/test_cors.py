"""The bound on a preflight's Access-Control-Request-Headers (serve/cors.py); the middleware
itself, on a real server and in a browser, is tested in tests/e2e/test_cors.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from localserve.serve.cors import (
    MAX_REQUESTED_CHARS,
    MAX_REQUESTED_HEADERS,
    requested_headers_problem,
)


def test_what_the_sdks_and_frontends_send_is_allowed():
    for asked in [
        None,
        "",
        "content-type",
        "Authorization, Content-Type",
        "authorization,content-type,x-stainless-os,x-stainless-retry-count,x-stainless-timeout",
        "x-api-key, anthropic-version, anthropic-beta, anthropic-dangerous-direct-browser-access",
        "openai-organization, openai-project, x-openwebui-user-name, x-openwebui-user-id",
        "x-localserve-user",
        ",".join(f"x-h{i}" for i in range(MAX_REQUESTED_HEADERS)),
    ]:
        assert requested_headers_problem(asked) is None, asked


def test_too_much_or_anything_but_header_names_is_refused_naming_the_field():
    for asked in [
        "x" * (MAX_REQUESTED_CHARS + 1),
        ",".join(f"x-h{i}" for i in range(MAX_REQUESTED_HEADERS + 1)),
        "a b",
        "a;b",
        "a,,b",
        ",",
        "a\r\nb",
        "caf\u00e9",
    ]:
        problem = requested_headers_problem(asked)
        assert problem and problem.startswith("Access-Control-Request-Headers: "), asked


@settings(deadline=None)  # a busy machine is no failure
@given(st.text(max_size=90))  # fewer than MAX_REQUESTED_HEADERS names
def test_any_text_is_either_allowed_as_names_or_refused(asked):
    problem = requested_headers_problem(asked)
    names = [n.strip(" \t") for n in asked.split(",")]
    ok = not asked.strip() or all(n and n.isascii() and n.replace("-", "").isalnum() for n in names)
    if ok:
        assert problem is None, asked
