"""`localserve users` (cli/users.py) through the real command line."""

from __future__ import annotations

from localserve.cli import main
from localserve.ops.auth import load_users


def test_add_prints_each_token_once_and_the_server_reads_them(tmp_path, capsys):
    path = tmp_path / "users.toml"
    assert main(["users", "add", "alice", "bob", "--file", str(path)]) == 0
    out, err = capsys.readouterr()
    printed = dict(line.split() for line in out.splitlines())
    assert printed == load_users(str(path))
    assert "restart" in err
    assert main(["users", "list", "--file", str(path)]) == 0
    assert capsys.readouterr().out.split() == ["alice", "bob"]  # names only, never tokens
    assert main(["users", "remove", "bob", "--file", str(path)]) == 0
    assert list(load_users(str(path))) == ["alice"]


def test_slips_are_one_line(tmp_path, capsys):
    path = tmp_path / "users.toml"
    assert main(["users", "add", "--file", str(path)]) == 2
    assert capsys.readouterr().err == "localserve: users add: give at least one name\n"
    assert main(["users", "remove", "carol", "--file", str(path)]) == 2
    assert capsys.readouterr().err == f"localserve: {path}: no such users file\n"
    assert not path.exists()


def test_an_edit_takes_from_others_what_the_file_gave_them_and_says_so(tmp_path, capsys):
    """A users file others may read holds every token in the open: add (or remove) keeps its
    owner's and group's bits (a service's group reads it) and takes the others'."""
    path = tmp_path / "users.toml"
    path.write_text('[users]\nkate = "correct-horse"\n')
    path.chmod(0o664)
    assert main(["users", "add", "alice", "--file", str(path)]) == 0
    assert path.stat().st_mode & 0o777 == 0o660
    assert f"{path}: others could read its tokens (mode 664); now 660" in capsys.readouterr().err
    assert main(["users", "remove", "alice", "--file", str(path)]) == 0
    assert "others could" not in capsys.readouterr().err  # nothing to say now
