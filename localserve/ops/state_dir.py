"""The state directory, trusted for nothing it holds: the server keeps its secrets and records
there (the monitor token, the usage record, people, conversations, stored responses).

`private_dir` makes it (0700) or checks it before a file in it is opened: a directory others
may write lets them put a link, or a file of their own, where a secret or a record goes, so it
is tightened (said once, at WARNING) when it is this user's own, and refused in one line when
it is shared (sticky, as /tmp is) or another user's: never tighten what others rely on.
`no_link` refuses a link in a file's place (a planted link would make the server read, or
write, whatever it points at). `file_identity` tells a store's file from one put in its place
(ops/usage.py and ops/people.py check it before they commit).

Tested in tests/unit/ops/test_state_dir.py.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from localserve.config import ConfigError

log = logging.getLogger("localserve.ops.state_dir")


def private_dir(path: Path) -> None:
    """`path` made (0700, its parents too) if missing; group and others' write taken from an
    existing one (said); ConfigError for what is not a directory, or one this user cannot
    tighten."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        found = os.stat(path)
    except OSError as e:
        raise ConfigError(f"{path}: cannot create the state directory: {e.strerror or e}") from None
    mode = stat.S_IMODE(found.st_mode)
    if not mode & 0o022:
        return
    shared = mode & stat.S_ISVTX or found.st_uid != os.geteuid()  # /tmp, or another's
    try:
        if shared:
            raise PermissionError
        os.chmod(path, mode & ~0o022)
    except OSError:
        raise ConfigError(
            f"{path}: others may write the state directory (mode {mode:o}), and it is not this "
            f"server's to change: set [server] state_dir to a directory of its own, or "
            f"`chmod go-w {path}`"
        ) from None
    log.warning(
        "state directory %s: others could write it (mode %o), and put their files in its "
        "secrets' places: now %o",
        path, mode, mode & ~0o022,
    )  # fmt: skip


def no_link(path: Path, what: str) -> None:
    """ConfigError when a link stands in `path`'s place (`what`: "the usage record")."""
    if path.is_symlink():
        raise ConfigError(
            f"{path}: a link in the place of {what}: links there are not followed; remove it"
        )


def file_identity(path: Path) -> tuple[int, int] | None:
    """The file at `path` (device, inode), None when there is none: a store deleted or replaced
    under the server is another identity."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino
