#!/usr/bin/env bash
# The DGL reference for benchmarks/sampler.py, set up on demand outside the project's environment (never a dependency):
# DGL 2.1.0, the newest DGL release on PyPI that imports here, with the torch it was built against.
#
#   benchmarks/dgl_venv.sh [VENV]          # default ~/.cache/hpcgnn/dgl-venv; prints the python to pass as --dgl
#
# DGL 2.1.0 needs torch 2.2.x, numpy<2 and pandas<2.3; its GraphBolt needs torchdata 0.7.1, installed without its
# dependencies (they would pull a newer torch); setuptools<70 keeps pkg_resources for DGL's imports.
set -euo pipefail
VENV=${1:-$HOME/.cache/hpcgnn/dgl-venv}
PYTHON=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --disable-pip-version-check "torch==2.2.1" "numpy<2" "pandas<2.3" "setuptools<70" \
    scipy networkx requests tqdm psutil pyyaml pydantic
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps "dgl==2.1.0" "torchdata==0.7.1"
"$VENV/bin/python" -c "import dgl, torch; print('dgl', dgl.__version__, 'torch', torch.__version__)" >&2
echo "$VENV/bin/python"
