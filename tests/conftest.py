"""Fixtures every directory of the tests needs: a state directory of their own."""

from __future__ import annotations

import os
import tempfile

import pytest


@pytest.fixture(scope="session", autouse=True)
def state_dir():
    """Servers started by the tests keep their usage database and access logs here, never in
    the developer's own state directory."""
    os.environ["LOCALSERVE_STATE_DIR"] = tempfile.mkdtemp(prefix="localserve-tests-")
    return os.environ["LOCALSERVE_STATE_DIR"]
