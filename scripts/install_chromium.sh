#!/usr/bin/env bash
# The browser tests (tests/e2e/test_chat_page.py) drive the system's Chromium: install it when it is
# missing and this user may (root, or sudo without a password). Otherwise say how, and the
# browser tests are skipped (CI sets LOCALSERVE_REQUIRE_BROWSER=1: there they fail instead).
set -u
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
else
    echo "install_chromium: no Chromium, and no right to install it: run 'sudo apt-get install chromium' for the browser tests" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_chromium: no apt-get here: install Chromium yourself for the browser tests" >&2
    exit 0
fi
echo "install_chromium: installing Chromium from the Debian packages (for the browser tests)"
$SUDO apt-get update -qq &&
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null ||
    echo "install_chromium: apt-get install chromium failed: the browser tests will not run" >&2
exit 0
