#!/usr/bin/env bash
# Sets up the project's environment (idempotent) and runs one job in it.
#
#   ./dev.sh site      build the site from the recorded evidence into site/ (on a GPU machine, first refresh
#                      the evidence that is missing or stale for that GPU)
#   ./dev.sh test      run the whole test suite (CPU: Triton's interpreter; browser tests in headless Chromium)
#   ./dev.sh serve     mkdocs serve with live reload, for authors: after the first build only the pages whose
#                      source changed are rebuilt (--dirty; a new page or a changed nav shows fully after a
#                      restart, or with `./dev.sh serve --full`); the evidence pages re-render beside the server
#                      when records, declarations, templates or kernels change (tools/mkdocs_hooks.py)
#   ./dev.sh setup     only install
#
# Without an NVIDIA GPU the environment is pinned by requirements/cpu.lock (torch's CPU build); with one,
# pip resolves pyproject.toml and takes torch's CUDA build.
set -euo pipefail
cd "$(dirname "$0")"

VENV="${KERNEL_LAB_VENV:-.venv}"
PY="$VENV/bin/python"
STAMP="$VENV/.kernel-lab-installed"

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

setup() {
    [ -x "$PY" ] || python3 -m venv "$VENV"
    if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ requirements/cpu.lock -nt "$STAMP" ]; then
        "$PY" -m pip install --quiet --upgrade pip
        if has_gpu; then
            "$PY" -m pip install --quiet -e '.[test]'
        else
            "$PY" -m pip install --quiet -r requirements/cpu.lock
            "$PY" -m pip install --quiet --no-deps -e .
        fi
        touch "$STAMP"
    fi
    "$PY" tools/vendor_assets.py
}

ensure_chromium() {
    [ -x /usr/bin/chromium ] && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "dev.sh: installing Debian's chromium for the browser tests"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
    else
        echo "dev.sh: /usr/bin/chromium is missing; install Debian's 'chromium' package (as root)" >&2
        return 1
    fi
}

job="${1:-}"
shift || true
case "$job" in
    setup) setup ;;
    site)
        setup
        "$PY" tools/build_results.py "$@"
        "$VENV/bin/mkdocs" build --strict
        ;;
    test)
        setup
        ensure_chromium
        "$PY" -m pytest -n "${KERNEL_LAB_TEST_WORKERS:-2}" "$@"
        ;;
    serve)
        setup
        if [ "${1:-}" = "--full" ]; then
            shift
            "$VENV/bin/mkdocs" serve "$@"
        else
            "$VENV/bin/mkdocs" serve --dirty "$@"
        fi
        ;;
    *)
        echo "usage: ./dev.sh {site|test|serve|setup} [args...]" >&2
        exit 2
        ;;
esac
