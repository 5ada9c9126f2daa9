#!/usr/bin/env bash
# wsim set-up and entry points. Creates (or reuses) .venv, installs wsim with its test extras, then runs:
#   ./dev.sh demo [wsim demo options]   render the built-in street scene into ./out and print a summary
#   ./dev.sh test [pytest options]      run the test suite
#   ./dev.sh bench [script]             run benchmarks/<script>.py (default raycast)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
stamp=.venv/.wsim-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  python -m pip install -q --upgrade pip
  # torch first, pinned: an unpinned torch would pull a multi-GB CUDA build where a CPU build is wanted
  python -m pip show torch >/dev/null 2>&1 || python -m pip install -q "torch==${WSIM_TORCH_VERSION:-2.13.0}"
  python -m pip install -q -e ".[test]"
  touch "$stamp"
fi
cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  demo) exec wsim demo "$@" ;;
  test) exec python -m pytest "$@" ;;
  bench) python -m pip install -q -e ".[bench]" && exec python "benchmarks/${1:-raycast}.py" "${@:2}" ;;
  *) echo "usage: ./dev.sh demo|test|bench [args]" >&2; exit 2 ;;
esac
