"""Vendor the site's front-end assets from the npm registry, so the site builds and reads with no network.

    python tools/vendor_assets.py            install what is missing (fast no-op when everything is there)
    python tools/vendor_assets.py --check    exit 1, naming what is missing, without touching the network
    python tools/vendor_assets.py --force    install again (downloading only what .cache/npm/ lacks)

KaTeX (math typesetting) and two font families (Inter for text, JetBrains Mono for code) are fetched with
`npm pack` at pinned versions, checked against the registry's sha512 integrity pinned here, and unpacked
into docs/assets/vendor/ (ignored by git). The tarballs stay in .cache/npm/ so a reinstall needs no network.
`./dev.sh setup` runs this on every call; tools/mkdocs_hooks.py refuses to build a site without it.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
VENDOR_DIR = ROOT / "docs" / "assets" / "vendor"
CACHE_DIR = ROOT / ".cache" / "npm"
STAMP = ".vendored.json"


@dataclass(frozen=True)
class Package:
    """One npm package, pinned, and which of its files land where.

    files: (path inside the package, path under docs/assets/vendor/<dest>/); a path ending in "/" copies
    that folder's files.
    """

    name: str
    version: str
    integrity: str  # the registry's dist.integrity for this version
    dest: str
    files: tuple[tuple[str, str], ...]

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def tarball(self) -> Path:
        # npm pack names scoped packages "scope-name-version.tgz"
        return CACHE_DIR / f"{self.name.lstrip('@').replace('/', '-')}-{self.version}.tgz"


def _font_files(family: str) -> tuple[tuple[str, str], ...]:
    return tuple(
        (f"files/{family}-latin-{weight}-normal.woff2", f"{family}-latin-{weight}-normal.woff2")
        for weight in (400, 500, 600, 700)
    ) + (("LICENSE", "LICENSE"),)


PACKAGES = (
    Package(
        "katex", "0.19.1",
        "sha512-jG8uKntjSEcm2EpQOh0XturpPuuC9r3Sq5HLHdsFdWZT27E672SF19QEi+of0/YeOy15lDgRhKvr5614uRrEfA==",
        "katex",
        (
            ("dist/katex.min.js", "katex.min.js"),
            ("dist/katex.min.css", "katex.min.css"),
            ("dist/contrib/auto-render.min.js", "contrib/auto-render.min.js"),
            ("dist/fonts/", "fonts/"),
            ("LICENSE", "LICENSE"),
        ),
    ),
    Package(
        "@fontsource/inter", "5.3.0",
        "sha512-RofMylZmjlJEfELXeNHFWBRcSs75rGU/6bV2S2jfnvv/3rPXPGe0LgUJTklcHZ9lM4OZmAVFhcJPnACfb91A3g==",
        "fonts/inter", _font_files("inter"),
    ),
    Package(
        "@fontsource/jetbrains-mono", "5.3.0",
        "sha512-fqDfB5I9f1p1TV486aUgB9t8zP84P0O1FtQR5Ol9vjwPy+S+EIGlVYm1cvj2W5shcZMTg2nZFdVMoH5wFu8a1A==",
        "fonts/jetbrains-mono", _font_files("jetbrains-mono"),
    ),
)


class VendorError(RuntimeError):
    """Something the reader can act on: npm missing, a download or integrity failure, a broken tarball."""


def sri_sha512(path: Path) -> str:
    digest = hashlib.sha512(path.read_bytes()).digest()
    return "sha512-" + base64.b64encode(digest).decode("ascii")


def _stamp(pkg: Package, vendor_dir: Path) -> dict | None:
    try:
        return json.loads((vendor_dir / pkg.dest / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_installed(pkg: Package, vendor_dir: Path | None = None) -> bool:
    """True when the pinned version is in place with every file it installed (no network, no hashing)."""
    vendor_dir = VENDOR_DIR if vendor_dir is None else vendor_dir
    stamp = _stamp(pkg, vendor_dir)
    if not stamp or stamp.get("spec") != pkg.spec or stamp.get("integrity") != pkg.integrity:
        return False
    files = stamp.get("files")
    if not isinstance(files, list) or not files:
        return False
    dest = vendor_dir / pkg.dest
    return all((dest / f).is_file() for f in files)


def missing(vendor_dir: Path | None = None) -> list[str]:
    """The pinned packages not (fully) installed under vendor_dir (default: the site's), as "name@version"."""
    return [pkg.spec for pkg in PACKAGES if not is_installed(pkg, vendor_dir)]


def fetch(pkg: Package) -> Path:
    """The package's tarball in .cache/npm/, downloaded with `npm pack` unless a verified copy is there."""
    if pkg.tarball.is_file() and sri_sha512(pkg.tarball) == pkg.integrity:
        return pkg.tarball
    npm = shutil.which("npm")
    if npm is None:
        raise VendorError(
            "npm is not installed, and the site's KaTeX and fonts come from the npm registry. Install Node.js "
            "with npm (Debian: `apt-get install npm`), then run `python tools/vendor_assets.py` again."
        )
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [npm, "pack", pkg.spec, "--pack-destination", str(CACHE_DIR), "--silent"],
        capture_output=True, text=True, timeout=300,
    )
    if proc.returncode != 0 or not pkg.tarball.is_file():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise VendorError(f"`npm pack {pkg.spec}` failed (exit {proc.returncode}); is the npm registry reachable?\n{tail}")
    got = sri_sha512(pkg.tarball)
    if got != pkg.integrity:
        pkg.tarball.unlink()
        raise VendorError(
            f"{pkg.spec}: the downloaded tarball's integrity is {got}, but {pkg.integrity} is pinned in "
            "tools/vendor_assets.py; the tarball was removed. Refusing to install it."
        )
    return pkg.tarball


def _members(pkg: Package, tar: tarfile.TarFile) -> list[tuple[tarfile.TarInfo, str]]:
    """(tar member, path under the destination) for every file the package's `files` selects."""
    by_name = {m.name: m for m in tar.getmembers() if m.isfile()}
    chosen: list[tuple[tarfile.TarInfo, str]] = []
    for src, dst in pkg.files:
        inner = f"package/{src}"
        if src.endswith("/"):
            found = sorted(n for n in by_name if n.startswith(inner))
            if not found:
                raise VendorError(f"{pkg.spec}: the tarball has no folder {src!r}")
            chosen += [(by_name[n], dst + n[len(inner):]) for n in found]
        elif inner in by_name:
            chosen.append((by_name[inner], dst))
        else:
            raise VendorError(f"{pkg.spec}: the tarball has no file {src!r}")
    for _, dst in chosen:  # the names come from the tarball: never let one escape the destination
        p = PurePosixPath(dst)
        if p.is_absolute() or ".." in p.parts:
            raise VendorError(f"{pkg.spec}: refusing the unsafe path {dst!r}")
    return chosen


def install(pkg: Package, vendor_dir: Path | None = None) -> None:
    """Unpack the selected files into a staging folder, then swap it in: a failure leaves no half install."""
    vendor_dir = VENDOR_DIR if vendor_dir is None else vendor_dir
    tarball = fetch(pkg)
    dest = vendor_dir / pkg.dest
    staging = dest.with_name(f".{dest.name}.staging-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            written = []
            for member, rel in _members(pkg, tar):
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
                written.append(rel)
        stamp = {"spec": pkg.spec, "integrity": pkg.integrity, "files": sorted(written)}
        (staging / STAMP).write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="report what is missing; install nothing")
    mode.add_argument("--force", action="store_true", help="install every package again")
    args = parser.parse_args(argv)

    todo = list(PACKAGES) if args.force else [p for p in PACKAGES if not is_installed(p)]
    if args.check:
        if todo:
            print(f"vendor_assets: missing {', '.join(p.spec for p in todo)}; run `python tools/vendor_assets.py`",
                  file=sys.stderr)
            return 1
        return 0
    try:
        for pkg in todo:
            install(pkg)
            print(f"vendor_assets: installed {pkg.spec} into {(VENDOR_DIR / pkg.dest).relative_to(ROOT)}")
    except (VendorError, subprocess.TimeoutExpired, tarfile.TarError, OSError) as exc:
        print(f"vendor_assets: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
