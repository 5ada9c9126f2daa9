#!/usr/bin/env bash
# wsim set-up and entry points. Creates (or reuses) the virtual environment .venv, installs what the command needs
# (once, and again after pyproject.toml changes), then runs it:
#   ./dev.sh demo [wsim demo options]       wsim alone (no PyTorch, no test tools); renders the built-in street
#                                            scene into ./out and prints a summary
#   ./dev.sh test [--fast] [pytest options] wsim with its test extras (PyTorch first, pinned); runs the test suite
#                                            (--fast: without the notebooks, the fresh-install check and the slow tests)
#   ./dev.sh bench [script]                 the test set plus the bench extras; runs benchmarks/<script>.py
#   ./dev.sh install demo|test|bench        installs only
# Environment:
#   PYTHON              interpreter that creates the virtual environment (default python3)
#   WSIM_VENV           virtual environment folder (default .venv)
#   WSIM_TORCH_VERSION  PyTorch version (default 2.13.0); an installed torch is kept as it is
#   WSIM_TORCH_INDEX    extra package index for PyTorch. Default: on Linux x86-64 without an NVIDIA driver, PyTorch's
#                       CPU index (the CPU build, torch==VERSION+cpu); elsewhere none (PyPI's build, CUDA on Linux).
#                       Set it empty to take plain torch==VERSION from your default index.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${WSIM_VENV:-.venv}
PIP=("$VENV/bin/python" -m pip)
TORCH_VERSION=${WSIM_TORCH_VERSION:-2.13.0}
CPU_INDEX=https://download.pytorch.org/whl/cpu

fresh() { [ -f "$VENV/.wsim-$1" ] && [ ! pyproject.toml -nt "$VENV/.wsim-$1" ]; }
has_nvidia_gpu() { [ -e /proc/driver/nvidia/version ] || nvidia-smi -L >/dev/null 2>&1; }

install_torch() {
  if "${PIP[@]}" show torch >/dev/null 2>&1; then
    echo "dev.sh: keeping the installed torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
    return
  fi
  local spec="torch==$TORCH_VERSION" index=${WSIM_TORCH_INDEX-}
  if [ -z "${WSIM_TORCH_INDEX+set}" ] && [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] && ! has_nvidia_gpu; then
    index=$CPU_INDEX
  fi
  if [ "$index" = "$CPU_INDEX" ]; then
    spec="$spec+cpu"
    echo "dev.sh: no NVIDIA driver found: installing the CPU build $spec (about 190 MB, once) from $index"
  else
    echo "dev.sh: installing $spec (once; on Linux PyPI's build is the CUDA one, several GB)${index:+ from $index}"
  fi
  if [ -n "$index" ]; then
    # only torch itself from that index: its dependencies come from the default one with the test extras next
    "${PIP[@]}" install --no-deps "$spec" --extra-index-url "$index"
  else
    "${PIP[@]}" install "$spec"
  fi
}

install() {  # install demo|test|bench
  local what=$1
  if fresh "$what" || { [ "$what" = demo ] && fresh test; }; then return; fi
  if [ ! -x "$VENV/bin/python" ]; then
    echo "dev.sh: creating the virtual environment $VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
    "${PIP[@]}" install -q --upgrade pip || true  # a newer pip is nice to have, not needed
  fi
  local q=()  # first install: pip shows what it downloads; an update (pyproject.toml changed) stays quiet
  "${PIP[@]}" show wsim >/dev/null 2>&1 && q=(-q)
  case "$what" in
    demo)
      echo "dev.sh: installing wsim and its dependencies (Warp, USD, gRPC, NumPy, trimesh, MCAP: about 230 MB of wheels, once)" \
           "into $VENV"
      "${PIP[@]}" install ${q[@]+"${q[@]}"} -e . ;;
    test)
      install_torch
      echo "dev.sh: installing wsim with its test extras (pytest, OpenCV, Jupyter, matplotlib; once) into $VENV"
      "${PIP[@]}" install ${q[@]+"${q[@]}"} -e ".[test]" ;;
    bench)
      install test
      case "$(ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true)" in
        *libusb-1.0*) ;;
        *) echo "dev.sh: Open3D (a benchmark peer) needs the Debian/Ubuntu package libusb-1.0-0: sudo apt-get install libusb-1.0-0" ;;
      esac
      "${PIP[@]}" install ${q[@]+"${q[@]}"} -e ".[bench]" ;;
    *) echo "usage: ./dev.sh install demo|test|bench" >&2; exit 2 ;;
  esac
  touch "$VENV/.wsim-$what"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  install) install "${1:-test}" ;;
  demo) install demo && exec "$VENV/bin/wsim" demo "$@" ;;
  test)
    install test
    args=() fast=0 selected=0
    for a in "$@"; do
      case "$a" in
        --fast) fast=1 ;;
        -*) args+=("$a") ;;
        *) args+=("$a"); selected=1 ;;
      esac
    done
    if [ $fast = 1 ]; then
      args=(-m "not notebooks and not install and not slow" ${args[@]+"${args[@]}"})
      [ $selected = 1 ] || echo "dev.sh: fast test suite (no notebooks, no fresh-install check, no slow tests): about 1 min on 2 CPU cores"
    elif [ $selected = 0 ]; then
      echo "dev.sh: full test suite: about 9-14 min on 2 CPU cores (2 of them the notebooks, 5 the CUDA build; a first" \
           "run also compiles Warp's kernels); ./dev.sh test --fast skips the notebooks, the fresh-install check and the" \
           "slow tests (about 1 min)"
    fi
    exec "$VENV/bin/python" -m pytest ${args[@]+"${args[@]}"} ;;
  bench) install bench && exec "$VENV/bin/python" "benchmarks/${1:-raycast}.py" "${@:2}" ;;
  *) echo "usage: ./dev.sh demo|test|bench|install [args]" >&2; exit 2 ;;
esac
