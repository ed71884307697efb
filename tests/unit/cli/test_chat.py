"""`localserve chat` (localserve/cli/chat.py): where the token comes from (--token, --token-file,
$LOCALSERVE_TOKEN) and the one-line answers for a token file it cannot use or a --resume that
names no conversation. Its chats, through a process, are in e2e/test_cli_slips.py."""

from __future__ import annotations

import pytest

from localserve.cli import build_parser
from localserve.cli.chat import chat_token
from localserve.config import ConfigError


def args(*argv: str):
    return build_parser().parse_args(["chat", *argv])


def test_the_token_comes_from_the_option_the_file_or_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCALSERVE_TOKEN", raising=False)
    assert chat_token(args()) is None
    monkeypatch.setenv("LOCALSERVE_TOKEN", "from-env")
    assert chat_token(args()) == "from-env"
    token_file = tmp_path / "token"
    token_file.write_text("  from-file \n# a comment nobody reads\n")
    assert chat_token(args("--token-file", str(token_file))) == "from-file"
    assert chat_token(args("--token", "from-option")) == "from-option"


def test_a_token_file_that_cannot_be_used_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="--token-file: cannot read .*: No such file"):
        chat_token(args("--token-file", str(tmp_path / "none")))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="--token-file: .* is empty"):
        chat_token(args("--token-file", str(tmp_path / "empty")))


def test_help_says_where_the_token_may_come_from(capsys):
    with pytest.raises(SystemExit):
        args("--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "--token-file FILE" in text and "$LOCALSERVE_TOKEN" in text and "/help" in text


def test_resume_takes_an_id_or_none_and_a_slip_is_one_line():
    from localserve.cli.chat import resume_id

    assert resume_id(args()) is None
    assert resume_id(args("--resume")) == ""  # the newest
    assert resume_id(args("--resume", "c1abc")) == "c1abc"
    assert resume_id(args("ws://127.0.0.1:9", "--resume")) == ""
    with pytest.raises(ConfigError, match=r"--resume: 'ws://h:1' is not a conversation id.*before"):
        resume_id(args("--resume", "ws://h:1"))
    with pytest.raises(ConfigError, match="…"):
        resume_id(args("--resume", "x" * 1000))
