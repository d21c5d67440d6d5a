#!/usr/bin/env bash
# Run hpcgnn on a GPU machine that has a CUDA torch and torch_geometric but reaches no package registry.
#
#   benchmarks/gpu_setup.sh download    # where pip reaches PyPI: hpcgnn's other dependencies as wheels in .whl/
#                                       # for the GPU machine's Python (PYVER, default 3.12), x86-64 Linux
#   benchmarks/gpu_setup.sh install     # on the GPU machine, in the repository: those wheels into $SITE
#                                       # (default /tmp/site), nothing from an index, its torch left alone
#   export PYTHONPATH=/tmp/site:$PWD    # then: python3 -m pytest -m gpu tests/test_gpu.py; python3 benchmarks/gpu.py
#
# The machine's own torch (>= 2.4) and torch_geometric stay: only what they lack travels
# (submitit, hydra-core, omegaconf and its antlr runtime, ogb and what it needs beyond the usual stack, pymetis,
# cryptography for the sampler servers' frame tags).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.whl}
PYVER=${PYVER:-3.12}
SITE=${SITE:-/tmp/site}
# Pinned to what CI tests; pure-Python wheels but pymetis, cryptography and cffi (compiled for PYVER) and antlr
# (built here from its sdist).
PACKAGES="submitit==1.5.4 hydra-core==1.3.8 omegaconf==2.3.1 ogb==1.3.6 outdated==0.2.2 littleutils==0.2.4 pymetis==2025.2.2
          cryptography==50.0.2 cffi==2.1.1 pycparser==3.12"

case "${1:-}" in
download)
    mkdir -p "$WHEELS"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$WHEELS" $PACKAGES
    # antlr4-python3-runtime 4.9.3 (omegaconf's parser) exists only as an sdist: build its pure-Python wheel here.
    python3 -m pip wheel --quiet --no-deps -w "$WHEELS" antlr4-python3-runtime==4.9.3
    ls "$WHEELS"
    ;;
install)
    python3 - <<'PY'
import sys, torch
major, minor = (int(p) for p in torch.__version__.split(".")[:2])
if (major, minor) < (2, 4):
    sys.exit(f"torch {torch.__version__} is older than hpcgnn's torch>=2.4")
import torch_geometric
print(f"using the machine's torch {torch.__version__} (CUDA {torch.version.cuda}, "
      f"{torch.cuda.device_count()} GPU(s)) and torch_geometric {torch_geometric.__version__}")
PY
    python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$WHEELS"/*.whl
    echo "export PYTHONPATH=$SITE:$PWD"
    ;;
*)
    echo "usage: $0 download|install" >&2
    exit 2
    ;;
esac
