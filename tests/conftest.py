"""Fixtures every directory of the tests needs (a state directory of their own, a small disk),
CI's rule that no test skips (tests/support/ci.py), and the property tests' settings.

The property tests (hypothesis) draw the same examples on every run (`derandomize`): a suite
that fails once in N runs is a flaky suite. Their deadline is off (a loaded machine takes
longer per example; the tests bound what matters themselves). `LOCALSERVE_FUZZ=1` explores new
examples instead, for a fuzzing session, not for CI."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest
from hypothesis import HealthCheck, settings

from tests.support.ci import cannot_run_here, is_ci
from tests.support.usage import Disk

settings.register_profile(
    "fixed", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("fuzz", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("fuzz" if os.environ.get("LOCALSERVE_FUZZ") else "fixed")

_skipped: list[str] = []  # on CI: the tests that skipped all the same


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
    command = ["mount", "-t", "tmpfs", "-o", "size=512k,mode=700", "tmpfs", str(where)]
    mounted = subprocess.run(command, capture_output=True, text=True)
    if mounted.returncode:
        cannot_run_here(f"cannot mount a tmpfs here (root only): {mounted.stderr.strip()}")
    try:
        yield Disk(where)
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Two groups for `make test`'s `pytest -n 2 --dist loadgroup`: the unit tests in one
    worker, everything else in the other, each in file order (the real model's tests stay in
    one process). The unit tests' half minute of one core runs beside the first e2e files
    instead of after them: what it saves and costs is measured in tests/README.md."""
    for item in items:
        unit = item.nodeid.startswith("tests/unit/")
        item.add_marker(pytest.mark.xdist_group("unit" if unit else "e2e"))


def pytest_runtest_logreport(report):
    if is_ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        _skipped.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    """On CI a skipped test fails the run: a guarantee whose test did not run is not kept."""
    if _skipped and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _skipped:
        terminalreporter.section("skipped on CI (LOCALSERVE_CI): the run fails", red=True)
        for line in _skipped:
            terminalreporter.write_line(line)
