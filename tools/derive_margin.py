#!/usr/bin/env python3
"""Derive each experiment's margin from the run records and write experiments/margins.json.

    python tools/derive_margin.py            write experiments/margins.json from records/
    python tools/derive_margin.py --check    exit 1 when the file differs from what the records give

Each experiment gets one margin per clock (GPU time, eager call): the spread of its speedup over the best
baseline when unchanged code is timed twice on the same GPU, pooled over experiments of its kind where it has
too few pairs of its own (lab.evidence.margin says exactly which pairs count and how the value is taken). Experiment declarations read their margin from
the file (experiments/_margins.py), so re-deriving it changes no hashed source: the verdicts move, the
evidence does not turn stale. Commit the file with the re-rendered pages.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from experiments import all_experiments  # noqa: E402
from experiments._margins import MARGINS_FILE  # noqa: E402
from lab.evidence.margin import derive_margins  # noqa: E402
from lab.evidence.store import load_records  # noqa: E402


def margins_text(records_dir: Path) -> str:
    records, problems = load_records(records_dir)
    for problem in problems:
        print(f"derive_margin: skipped {problem}", file=sys.stderr)
    data = derive_margins(all_experiments(), records, ROOT)
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="derive_margin.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records-dir", type=Path, default=ROOT / "records", help="where run records live")
    parser.add_argument("--out", type=Path, default=MARGINS_FILE, help="the margins file to write")
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when the file is out of date")
    args = parser.parse_args(argv)
    text = margins_text(args.records_dir)
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
        if current != text:
            print(f"derive_margin: {args.out} differs from what the records give; run tools/derive_margin.py",
                  file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    for slug, clocks in json.loads(text)["experiments"].items():
        for clock, entry in clocks.items():
            print(f"{slug}\t{clock}\t±{entry['fraction']:.1%}\t{entry['source']}\t{entry['comparisons']} comparisons")
    return 0


if __name__ == "__main__":
    sys.exit(main())
