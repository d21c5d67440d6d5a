"""``hpcgnn [overrides]`` / ``python -m hpcgnn [overrides]``: compose the config, then run or submit it.

    hpcgnn [-m] [--cfg] KEY=VALUE ... GROUP=OPTION ... +cluster=NAME   train (a sweep with -m)
    hpcgnn data prepare dataset=NAME ...                               python -m hpcgnn.data
    hpcgnn partition dataset=NAME graph.num_parts=K ...                python -m hpcgnn.partition
    hpcgnn status SWEEP_DIR [--wait]                                   python -m hpcgnn status
    hpcgnn report RUN_OR_SWEEP_DIR                                     python -m hpcgnn report
    hpcgnn cluster init NAME [--partition P]                           python -m hpcgnn cluster
    hpcgnn predict RUN_DIR [split=all] [--embeddings] ...              a trained model's outputs, every node
    hpcgnn export RUN_DIR [which=best] [out=FILE]                      the model as a plain PyG file
    hpcgnn tune 'train.lr=tag(log, interval(1e-4,1e-2))' tune.trials=N   a search with early stopping (Optuna)

Options: -m/--multirun expands comma lists into a sweep (every combination; one SLURM job
array with +cluster); --cfg prints the composed config and exits; -h/--help prints this.
Exit codes: 0 done, 1 failed, 2 a user error (the message names the fix), 3 preempted.
"""

from __future__ import annotations

import importlib
import sys

from hpcgnn.env import full_error
from hpcgnn.errors import EXIT_INTERRUPTED, UserError, report

# subcommand -> module whose main(argv) -> exit code runs it
SUBCOMMANDS = {
    "data": "hpcgnn.data.__main__",
    "partition": "hpcgnn.partition.__main__",
    "status": "hpcgnn.submit.status",
    "report": "hpcgnn.submit.report",
    "cluster": "hpcgnn.submit.cluster",
    "predict": "hpcgnn.submit.predict",
    "export": "hpcgnn.submit.export",
    "tune": "hpcgnn.submit.tune",
}
FLAGS = {"-m": "multirun", "--multirun": "multirun", "--cfg": "cfg", "-c": "cfg", "-h": "help", "--help": "help"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from hpcgnn.trust import private_umask

    private_umask()  # (run folders others cannot write, whatever the user's umask: hpcgnn.trust refuses those)
    if argv and argv[0] in SUBCOMMANDS:
        return importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:])
    flags = {FLAGS[a] for a in argv if a in FLAGS}
    overrides = [a for a in argv if a not in FLAGS]
    if "help" in flags:
        print(__doc__.strip())
        return 0
    unknown = [a for a in overrides if a.startswith("-")]
    try:
        if unknown:
            raise UserError(f"unknown option {unknown[0]!r}: hpcgnn takes -m, --cfg, --help, KEY=VALUE overrides "
                            f"and the subcommands {', '.join(SUBCOMMANDS)}")
        return train(overrides, multirun="multirun" in flags, print_config="cfg" in flags)
    except UserError as exc:
        return report(exc, full_error())


def train(overrides: list[str], multirun: bool = False, print_config: bool = False) -> int:
    """Compose (every member of a sweep, all checked before anything runs), then launch."""
    from pathlib import Path

    from hpcgnn.submit.compose import compose, compose_sweep
    from hpcgnn.submit.executor import resolved_yaml
    from hpcgnn.submit.launch import launch

    if not multirun:
        composed = compose(overrides)
        if print_config:
            print(resolved_yaml(composed.cfg), end="")
            return 0
        return launch(composed.cfg, composed.overrides)
    from hpcgnn.submit.sweep import SweepMember, launch_sweep

    members = compose_sweep(overrides)
    if print_config:
        for m in members:
            print(f"# member {m.cfg.run_dir}\n{resolved_yaml(m.cfg)}")
        return 0
    sweep = [SweepMember(num=i, overrides=list(m.overrides), cfg=m.cfg) for i, m in enumerate(members)]
    return launch_sweep(sweep, Path(members[0].sweep_dir))


def cli() -> None:
    """The ``hpcgnn`` console script. A Ctrl-C that nothing closer caught (a second one, as the first ends the
    run) exits 130 without a traceback; once the command ends on a Ctrl-C, further ones are ignored, so that
    none turns the exit into a KeyboardInterrupt at shutdown."""
    import signal

    try:
        code = main()
        if code == EXIT_INTERRUPTED:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        code = EXIT_INTERRUPTED
    from hpcgnn.process import end_quickly

    end_quickly()  # (a rank or server srun started, which imported torch)
    sys.exit(code)


if __name__ == "__main__":
    cli()
