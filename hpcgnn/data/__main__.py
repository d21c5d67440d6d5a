"""``python -m hpcgnn.data prepare|download dataset=NAME [overrides]``: make a dataset ready for training.

    prepare    download (OGB datasets, when their files are not under dataset.root yet) and prepare
               the memory-mappable graph; does nothing when it is already prepared
    download   only fetch OGB's raw files into dataset.root/ogb/ (nothing else): on a machine with
               internet, a login node; then ``prepare`` anywhere, compute nodes included

Compute nodes often have no internet, and training jobs never download.
"""

from __future__ import annotations

import sys

from hpcgnn.env import full_error
from hpcgnn.errors import EXIT_USER_ERROR, UserError, report

COMMANDS = ("prepare", "download")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        return EXIT_USER_ERROR if not argv or argv[0] not in ("-h", "--help") else 0
    import hpcgnn.data.cache as cache
    from hpcgnn.io import stop_cleanly_on_sigterm
    from hpcgnn.logs import setup_logging
    from hpcgnn.specs import datasets
    from hpcgnn.submit.compose import compose

    setup_logging(argv[0], main=True)  # what it does and how far it is, minute by minute
    try:
        cfg = compose(argv[1:]).cfg.dataset
        if argv[0] == "download":
            if datasets.spec(cfg.name).source not in ("ogb", "ogbg"):
                where = "its files are read from dataset.path" if cfg.name == "files" else "it is generated"
                print(f"dataset={cfg.name} has nothing to download ({where}); prepare it with: "
                      f"python -m hpcgnn.data prepare {' '.join(argv[1:])}")
                return 0
            from hpcgnn.data.ogb import download_raw

            with stop_cleanly_on_sigterm("download"):
                folder = download_raw(cfg)
            print(f"{cfg.name}: OGB's files are in {folder}; prepare it anywhere with: "
                  f"python -m hpcgnn.data prepare {' '.join(argv[1:])}")
            return 0
        from hpcgnn.data.prepared import prepare

        with stop_cleanly_on_sigterm("prepare"):
            folder = prepare(cfg, allow_download=True)
    except UserError as exc:
        return report(exc, full_error())
    print(f"{cfg.name}: prepared in {folder} ({cache.human_bytes(cache.size_bytes(folder))})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
