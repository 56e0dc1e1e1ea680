"""The protocol table of saved rehearsals: the hours and the bandwidth floor from their report.json files.

    python -m bench.rehearsal.retable --problems 30 --runs 64 --pool 512 --gpus 8 runs/a/fp8/report.json ...

Each configuration of a protocol rehearsal is best run as its own process (minutes to an hour of CPU each);
this puts their rows in one table, extrapolated again under the protocol the flags name (the one they were
rehearsed for: the sample is read from the flags, not from the reports), on the device --device names.
"""
from __future__ import annotations

import argparse
import json
import sys

from engine.config import positive_int
from engine.device_model import DeviceParams

from bench.rehearsal import protocol
from bench.rehearsal.checks import Refused


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rehearsal.retable", description=__doc__.split("\n\n")[0])
    p.add_argument("reports", nargs="+", help="report.json files of python -m bench.rehearsal")
    p.add_argument("--preset", choices=("low", "medium", "high"), default="high")
    p.add_argument("--problems", type=positive_int, default=None)
    p.add_argument("--runs", type=positive_int, default=1)
    p.add_argument("--pool", type=positive_int)
    p.add_argument("--gpus", type=positive_int, default=1)
    p.add_argument("--sample-problems", type=positive_int)
    p.add_argument("--sample-runs", type=positive_int)
    p.add_argument("--device", default="h200", help="the device the reports were rehearsed on (their floor's prices)")
    args = p.parse_args(argv)
    args.replay = None
    from bench.rehearsal.__main__ import PRESETS
    try:
        proto = protocol.protocol_of(args, PRESETS[args.preset])
        device = DeviceParams.named(args.device)
        results = {}
        for path in args.reports:
            with open(path) as f:
                res = json.load(f)
            res["protocol"] = protocol.extrapolate(proto, res, device)
            results[res["config"]] = res
    except (Refused, ValueError, OSError) as e:
        print(f"{p.prog}: {e}", file=sys.stderr)
        return 2
    print(protocol.table(proto, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
