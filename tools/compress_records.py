#!/usr/bin/env python3
"""Convert run records from plain JSON (records/<slug>/<run-id>.json) to the compressed form the lab writes
now (<run-id>.json.gz), losslessly, and remove each plain file once its compressed twin is proven equal.

    python tools/compress_records.py            convert every plain record under records/
    python tools/compress_records.py --check    say what would be converted; change nothing
    python tools/compress_records.py --records-dir DIR

The compressed file holds the plain file's very bytes (gzip, no name or time in its header). Before the
plain file goes, the conversion checks that decompressing gives those bytes back and that both forms load
(lab.evidence.store) to equal records. A plain file that is not a valid record is left alone and named; an
existing .json.gz is never overwritten.

Exit codes: 0 every plain record converted (or none to convert); 1 some file was left as it was; 2 bad usage.
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lab.evidence.records import RecordError  # noqa: E402
from lab.evidence.store import compress, load_record  # noqa: E402


def convert(plain: Path) -> Path:
    """Write plain's .json.gz twin, prove it equal, remove plain; RecordError / OSError say why not."""
    record = load_record(plain)
    raw = plain.read_bytes()
    packed = plain.with_name(plain.name + ".gz")
    fd = os.open(packed, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # never over an existing record
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(compress(raw))
            out.flush()
            os.fsync(out.fileno())
        if gzip.decompress(packed.read_bytes()) != raw or load_record(packed) != record:
            raise RecordError("the compressed file does not read back as the plain one")
    except BaseException:
        packed.unlink(missing_ok=True)
        raise
    plain.unlink()
    return packed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="compress_records.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records-dir", type=Path, default=ROOT / "records")
    parser.add_argument("--check", action="store_true", help="list what would be converted; change nothing")
    args = parser.parse_args(argv)
    if not args.records_dir.is_dir():
        print(f"compress_records: {args.records_dir} is not a folder of run records", file=sys.stderr)
        return 2
    plain = sorted(p for p in args.records_dir.glob("*/*.json") if not p.name.startswith("."))
    before = after = 0
    failed = 0
    for path in plain:
        if args.check:
            print(f"would convert {path}")
            continue
        try:
            size = path.stat().st_size
            packed = convert(path)
        except (RecordError, OSError) as exc:
            print(f"compress_records: left {path} as it was: {exc}", file=sys.stderr)
            failed += 1
            continue
        before, after = before + size, after + packed.stat().st_size
    if not args.check:
        print(f"compress_records: {len(plain) - failed} of {len(plain)} record(s) compressed, "
              f"{before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
