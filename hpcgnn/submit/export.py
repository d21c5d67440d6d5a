"""``hpcgnn export RUN_DIR [which=best|last] [out=FILE]``: a run's trained model as a plain PyG model file, which
torch and the class it names load without hpcgnn (:func:`hpcgnn.models.saved.plain`)."""

from __future__ import annotations

from hpcgnn.env import full_error
from hpcgnn.errors import PredictError, UserError, report


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    try:
        options = {"which": "best", "out": None, "trust": "false"}
        for arg in argv[1:]:
            key, eq, value = arg.partition("=")
            if not eq or key not in options or key == "trust" and value not in ("true", "false"):
                raise PredictError(f"hpcgnn export takes which=best|last, out=FILE and trust=true|false; got {arg!r}")
            options[key] = value
        from hpcgnn.models.saved import export

        path = export(argv[0], options["which"], options["out"], options["trust"] == "true")
        print(f"exported: {path}")
        return 0
    except UserError as exc:
        return report(exc, full_error())
