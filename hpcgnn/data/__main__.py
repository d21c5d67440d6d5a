"""``python -m hpcgnn.data prepare dataset=NAME [overrides]``: download and prepare a dataset.

Run it on a login node: compute nodes often have no internet, and training jobs
never download. Does nothing when the prepared dataset is already there.
"""

from __future__ import annotations

import sys

from hpcgnn.errors import EXIT_USER_ERROR, UserError, report


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "prepare":
        print(__doc__.strip(), file=sys.stderr)
        return EXIT_USER_ERROR if not argv or argv[0] not in ("-h", "--help") else 0
    from hpcgnn.compose import compose
    from hpcgnn.data import cache, prepare
    from hpcgnn.io import stop_cleanly_on_sigterm

    try:
        cfg = compose(argv[1:]).cfg.dataset
        with stop_cleanly_on_sigterm("prepare"):
            folder = prepare(cfg, allow_download=True)
    except UserError as exc:
        return report(exc)
    print(f"{cfg.name}: prepared in {folder} ({cache.human_bytes(cache.size_bytes(folder))})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
