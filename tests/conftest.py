"""Fixtures every directory of the tests needs: a state directory of their own, a small disk."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest

from tests.support.usage import Disk


@pytest.fixture(scope="session", autouse=True)
def state_dir():
    """Servers started by the tests keep their usage database and access logs here, never in
    the developer's own state directory."""
    os.environ["LOCALSERVE_STATE_DIR"] = tempfile.mkdtemp(prefix="localserve-tests-")
    return os.environ["LOCALSERVE_STATE_DIR"]


@pytest.fixture
def small_disk(tmp_path):
    """A 512 KiB tmpfs (tests/support/usage.py's Disk); skipped where mounting needs root."""
    where = tmp_path / "disk"
    where.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(where)]
    mounted = subprocess.run(command, capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here (root only): {mounted.stderr.strip()}")
    try:
        yield Disk(where)
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
