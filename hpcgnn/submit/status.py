"""``python -m hpcgnn status SWEEP_DIR [--wait]``: the members of a sweep, their state and best accuracy."""

from __future__ import annotations

import sys

from hpcgnn.submit.sweep import status_main as main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
