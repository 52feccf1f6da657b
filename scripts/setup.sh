#!/usr/bin/env bash
# Creates .venv and installs the project into it (idempotent: skipped while pyproject.toml is unchanged).
#   scripts/setup.sh          runtime dependencies only
#   scripts/setup.sh test     plus the test tools, and Debian's prometheus package for the integration tests
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python="${PYTHON:-python3}"

if [ ! -x .venv/bin/python ]; then
    if ! "$python" -m venv .venv >/dev/null 2>&1; then
        # Debian's python3 ships venv separately.
        rm -rf .venv
        echo "setup: installing python3-venv (Debian)" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
        "$python" -m venv .venv
    fi
fi

spec="."
[ "$extras" = "test" ] && spec=".[test]"
stamp=".venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)-${extras:-runtime}"
if [ ! -f "$stamp" ]; then
    echo "setup: installing $spec into .venv (about a minute the first time)" >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$spec"
    touch "$stamp"
fi

if [ "$extras" = "test" ] && ! command -v prometheus >/dev/null 2>&1; then
    echo "setup: installing Debian's prometheus and promtool for the integration tests" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

if [ "$extras" = "test" ] && ! command -v openssl >/dev/null 2>&1; then
    echo "setup: installing Debian's openssl (certificates and keys of the tests' real control plane)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssl >/dev/null
fi
