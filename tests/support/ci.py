"""What CI (`.ci/run`, which sets LOCALSERVE_CI=1) demands of the tests: none skipped.

A test that cannot run on some machine (no tmpfs without root, no PID namespaces) skips there;
on CI, the machine that must prove the guarantee, it fails instead, and `tests/conftest.py`
fails the run when any test skipped there all the same."""

from __future__ import annotations

import os

import pytest


def is_ci() -> bool:
    return bool(os.environ.get("LOCALSERVE_CI"))


def cannot_run_here(why: str) -> None:
    """Skip this test, saying why; on CI fail it: CI must run every test."""
    if is_ci():
        pytest.fail(f"{why}: CI must run this test (LOCALSERVE_CI is set)")
    pytest.skip(why)
