#!/usr/bin/env bash
# The PyG reference with pyg-lib for the benchmarks, set up on demand outside the project's environment (never a
# dependency): a venv with this project's torch, hpcgnn (so the benchmarks import it) and pyg-lib built from source.
#
#   benchmarks/pyglib_venv.sh [VENV]     # default ~/.cache/hpcgnn/pyg-venv; prints the python to run benchmarks with
#
# pyg-lib has no wheel for every torch/platform pair, but builds from its public source: pyg-team/pyg-lib with its
# submodules third_party/parallel-hashmap and third_party/METIS (which holds GKlib as its own submodule); the CUDA
# ones (cutlass, cuCollections, cccl) are not needed for a CPU build. Each source is a git URL or a local clone
# (e.g. a mirror without a work tree); the submodules are checked out at the commits pyg-lib records:
#
#   PYG_LIB_GIT=/path/pyg-lib.git PHMAP_GIT=/path/parallel-hashmap.git METIS_GIT=/path/METIS.git \
#   GKLIB_GIT=/path/GKlib.git PYG_LIB_REF=master benchmarks/pyglib_venv.sh
#
# The build compiles about 150 C++ files: about 15 minutes on 2 cores (MAX_JOBS sets the parallelism).
set -euo pipefail
VENV=${1:-$HOME/.cache/hpcgnn/pyg-venv}
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PYG_LIB_GIT=${PYG_LIB_GIT:-https://github.com/pyg-team/pyg-lib.git}
PHMAP_GIT=${PHMAP_GIT:-https://github.com/greg7mdp/parallel-hashmap.git}
METIS_GIT=${METIS_GIT:-https://github.com/KarypisLab/METIS.git}
GKLIB_GIT=${GKLIB_GIT:-https://github.com/KarypisLab/GKlib.git}
PYG_LIB_REF=${PYG_LIB_REF:-HEAD}
TORCH=${TORCH:-$(grep -Eo 'torch==[0-9.]+' "$HERE/README.md" | head -1)}
TORCH=${TORCH:-torch}

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)
"${PIP[@]}" "$TORCH" setuptools wheel cmake ninja
"${PIP[@]}" -e "$HERE"

SRC=$(mktemp -d "${TMPDIR:-/tmp}/pyg-lib-src.XXXXXX")
trap 'rm -rf "$SRC"' EXIT
# A clone at the commit the superproject records for one of its submodules.
checkout_submodule() {  # superproject path url
    local commit
    commit=$(git -C "$1" ls-tree HEAD "$2" | awk '{print $3}')
    [ -n "$commit" ] || { echo "pyglib_venv: $1 records no submodule $2" >&2; exit 1; }
    rm -rf "${1:?}/$2"
    git clone -q --no-checkout "$3" "$1/$2"
    git -C "$1/$2" checkout -q "$commit"
}
git clone -q --no-checkout "$PYG_LIB_GIT" "$SRC/pyg-lib"
git -C "$SRC/pyg-lib" checkout -q "$PYG_LIB_REF"
checkout_submodule "$SRC/pyg-lib" third_party/parallel-hashmap "$PHMAP_GIT"
checkout_submodule "$SRC/pyg-lib" third_party/METIS "$METIS_GIT"
checkout_submodule "$SRC/pyg-lib/third_party/METIS" GKlib "$GKLIB_GIT"
echo "pyglib_venv: building pyg-lib $(git -C "$SRC/pyg-lib" describe --tags --always) against" \
    "$("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)')" >&2
(cd "$SRC/pyg-lib" && FORCE_CUDA=0 MAX_JOBS=${MAX_JOBS:-$(nproc)} PATH="$VENV/bin:$PATH" \
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation .)
"$VENV/bin/python" -c "import pyg_lib, torch_geometric.typing as t; assert t.WITH_PYG_LIB; \
print('pyg_lib', pyg_lib.__version__, 'torch_geometric', __import__('torch_geometric').__version__)" >&2
echo "$VENV/bin/python"
