#!/usr/bin/env bash
# Sets up the project's environment (idempotent) and runs one job in it.
#
#   ./dev.sh site      build the site from the recorded evidence into site/ (on a GPU machine, first refresh
#                      the evidence that is missing or stale for that GPU)
#   ./dev.sh test      run the whole test suite (CPU: Triton's interpreter; browser tests in Chromium's headless shell)
#   ./dev.sh serve     mkdocs serve with live reload, for authors: after the first build only the pages whose
#                      source changed are rebuilt (--dirty; a new page or a changed nav shows fully after a
#                      restart, or with `./dev.sh serve --full`); the evidence pages re-render beside the server
#                      when records, declarations, templates or kernels change (tools/mkdocs_hooks.py)
#   ./dev.sh run X ... run X in the environment: a Python script (tools/build_results.py --list) or a command
#                      the environment installs (benchmark-softmax, mkdocs)
#   ./dev.sh python .. the environment's Python (./dev.sh python -m pytest tests/test_softmax.py)
#   ./dev.sh setup     only install
#
# Without an NVIDIA GPU the environment is pinned by requirements/cpu.lock (torch's CPU build); with one, by
# requirements/gpu.lock (the torch and Triton the records were measured on). KERNEL_LAB_STACK=resolve lets
# pip resolve pyproject.toml instead, to try the newest torch and Triton.
set -euo pipefail
cd "$(dirname "$0")"

VENV="${KERNEL_LAB_VENV:-.venv}"
PY="$VENV/bin/python"
STAMP="$VENV/.kernel-lab-installed"

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

setup() {
    [ -x "$PY" ] || python3 -m venv "$VENV"
    if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ requirements/cpu.lock -nt "$STAMP" ] \
        || [ requirements/gpu.lock -nt "$STAMP" ]; then
        "$PY" -m pip install --quiet --upgrade pip
        if has_gpu && [ "${KERNEL_LAB_STACK:-locked}" = resolve ]; then
            "$PY" -m pip install --quiet -e '.[test]'
        elif has_gpu; then
            "$PY" -m pip install --quiet -r requirements/gpu.lock
            "$PY" -m pip install --quiet --no-deps -e .
        else
            "$PY" -m pip install --quiet -r requirements/cpu.lock
            "$PY" -m pip install --quiet --no-deps -e .
        fi
        touch "$STAMP"
    fi
    "$PY" tools/vendor_assets.py
}

# The browser tests run Chromium's headless shell (tests/test_site_browser.py says why).
ensure_chromium() {
    [ -x /usr/bin/chromium-headless-shell ] && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "dev.sh: installing Debian's chromium-headless-shell for the browser tests"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium-headless-shell fonts-dejavu-core >/dev/null
    else
        echo "dev.sh: /usr/bin/chromium-headless-shell is missing; install Debian's 'chromium-headless-shell' package (as root)" >&2
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
        # Byte-compile the project once (written whatever PYTHONDONTWRITEBYTECODE says; up to date, a no-op), so
        # neither the workers nor the Pythons the tests start (Ray workers, renders, builds) compile it again each.
        # Test modules are left out: pytest compiles them with its assertion rewriting, into a cache of its own. A
        # file that does not compile is left for pytest to report.
        "$PY" -m compileall -q -x '(^|/)(test_[^/]*|conftest)\.py$' lab kernels experiments probes tools checks tests || true
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
    run)
        if [ $# -eq 0 ]; then
            echo "usage: ./dev.sh run <script.py | command> [args...]" >&2
            exit 2
        fi
        setup
        target="$1"
        shift
        if [ -f "$target" ]; then
            exec "$PY" "$target" "$@"
        elif [ -x "$VENV/bin/$target" ]; then
            exec "$VENV/bin/$target" "$@"
        else
            echo "dev.sh run: $target is neither a file nor a command in $VENV/bin" >&2
            exit 2
        fi
        ;;
    python)
        setup
        exec "$PY" "$@"
        ;;
    *)
        echo "usage: ./dev.sh {site|test|serve|run|python|setup} [args...]" >&2
        exit 2
        ;;
esac
