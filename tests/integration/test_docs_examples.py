"""The docs' copy-paste examples, run against the session's server: every `$ curl ...` line with its output shown in
README.md, docs/clients.md, docs/embeddings.md, docs/generation.md and docs/serving.md (for the models the server
loads), and the Python snippets of docs/clients.md whose output is shown; those of the image models
(tests/conftest.py IMAGE_MODELS) against the session's image server, in a folder holding the photo they post
(``cat.jpg``). What comes back must have the shape the docs show: the same keys, types and list lengths (a list shown
with `...` elided: its elements' type), the same error codes and messages, the same token counts; floats may differ
in their last digits (another CPU) and generated text in its characters (random weights).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import IMAGE_MODELS

REPO = Path(__file__).resolve().parents[2]
CURL_PAGES = ("README.md", "docs/clients.md", "docs/embeddings.md", "docs/generation.md", "docs/serving.md")
SNIPPET_PAGES = ("docs/clients.md",)
DOC_HOST = re.compile(r"(?:http://)?(?:localhost|127\.0\.0\.1):8080")
ELIDED = "\u2026"  # what a `...` of the docs becomes: any value (in a list: any number of them)
# Values compared exactly where the docs show them; anything else only by type.
EXACT_KEYS = {"code", "type", "message", "param", "object", "truncated", "model", "prompt_tokens", "index", "role"}
STATUS = re.compile(r" HTTP (\d{3})$")


def fenced_blocks(text):
    """(first line number, language, lines) of each fenced block."""
    blocks, current = [], None
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("```"):
            if current is None:
                current = (number, line[3:].strip(), [])
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current[2].append(line)
    return blocks


def curl_examples(page):
    """(where, command, shown output) of each `$ curl` line of a page that has its output below it."""
    examples = []
    for first, _, lines in fenced_blocks((REPO / page).read_text()):
        index = 0
        while index < len(lines):
            if not lines[index].startswith("$ curl"):
                index += 1
                continue
            start = index
            command = lines[index][2:]
            while command.endswith("\\") and index + 1 < len(lines):
                index += 1
                command = command[:-1] + " " + lines[index].strip()
            index += 1
            shown = []
            while index < len(lines) and lines[index].strip() and not lines[index].startswith("$ "):
                shown.append(lines[index])
                index += 1
            if shown:
                examples.append((f"{page}:{first + start + 1}", command, "\n".join(shown)))
    return examples


def python_snippets(page):
    """(where, code, shown output) of each Python block followed by a plain block (its output)."""
    blocks = fenced_blocks((REPO / page).read_text())
    return [
        (f"{page}:{first}", "\n".join(code), "\n".join(output))
        for (first, language, code), (_, next_language, output) in zip(blocks, blocks[1:], strict=False)
        if language == "python" and next_language == "" and output
    ]


def model_of(command):
    match = re.search(r"/predictions/([\w-]+)", command)
    return match.group(1) if match else None


def with_elisions(text):
    """The docs' JSON with each `...` outside strings turned into a value that matches anything."""
    out, in_string, escaped = [], False, False
    index = 0
    while index < len(text):
        char = text[index]
        if in_string:
            escaped = char == "\\" and not escaped
            in_string = not (char == '"' and not escaped)
        elif char == '"':
            in_string = True
        elif text.startswith("...", index):
            out.append(json.dumps(ELIDED))
            index += 3
            continue
        out.append(char)
        index += 1
    return "".join(out)


def same_shape(shown, real, where="answer"):
    """Problems between a documented value and the server's (empty when the shapes agree)."""
    if shown == ELIDED:
        return []
    if isinstance(shown, dict):
        return same_object(shown, real, where)
    if isinstance(shown, list):
        return same_list(shown, real, where)
    if isinstance(shown, bool) or isinstance(real, bool):
        return [] if type(shown) is type(real) else [f"{where}: {shown!r} in the docs, {real!r} served"]
    if isinstance(shown, int | float):
        return [] if isinstance(real, int | float) else [f"{where}: a number in the docs, {real!r} served"]
    if isinstance(shown, str):
        return [] if isinstance(real, str) else [f"{where}: a string in the docs, {real!r} served"]
    return [] if shown == real else [f"{where}: {shown!r} in the docs, {real!r} served"]


def same_object(shown, real, where):
    if not isinstance(real, dict):
        return [f"{where}: an object in the docs, {type(real).__name__} served"]
    if set(shown) != set(real):
        return [f"{where}: keys {sorted(shown)} in the docs, {sorted(real)} served"]
    problems = []
    for key, value in shown.items():
        exact = key in EXACT_KEYS and isinstance(value, str | int | bool) and ELIDED not in str(value)
        if exact and value != real[key] and not (key == "message" and "..." in value):
            problems.append(f"{where}.{key}: {value!r} in the docs, {real[key]!r} served")
        elif not exact:
            problems += same_shape(value, real[key], f"{where}.{key}")
    return problems


def same_list(shown, real, where):
    if not isinstance(real, list):
        return [f"{where}: a list in the docs, {type(real).__name__} served"]
    items = [item for item in shown if item != ELIDED]
    if len(items) < len(shown):  # elided: every served element has the shape of the shown ones
        return [p for item in real for p in same_shape(items[0], item, f"{where}[]")] if items and real else []
    if len(shown) != len(real):
        return [f"{where}: {len(shown)} elements in the docs, {len(real)} served"]
    return [p for i, (a, b) in enumerate(zip(shown, real, strict=True)) for p in same_shape(a, b, f"{where}[{i}]")]


@pytest.fixture(scope="module")
def served_models(ts_server):
    return {Path(archive).stem for archive in ts_server.props.get("load_models", "").split(",") if archive}


def docs_photo(folder):
    """The `cat.jpg` the image examples post: a 64x48 JPEG (a gradient with a disc, so it is no flat colour)."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:48, 0:64]
    disc = ((x - 40) ** 2 + (y - 20) ** 2 < 150) * 120
    pixels = np.stack([x * 4, y * 5, (x + y + disc) % 256], axis=-1).astype(np.uint8)
    Image.fromarray(pixels, "RGB").save(folder / "cat.jpg", "JPEG", quality=90)


@pytest.fixture
def example_server(request, tmp_path):
    """for_model(model) -> (server, folder to run in): the image server for the image models, the session's server
    for its models (each started on first use), skipped for another model."""

    def for_model(model):
        if model in IMAGE_MODELS:
            docs_photo(tmp_path)
            return request.getfixturevalue("image_models").server, tmp_path
        if model in request.getfixturevalue("served_models"):
            return request.getfixturevalue("ts_server"), REPO
        pytest.skip(f"{model} is not a model of the session's server or the image server")

    return for_model


CURL_EXAMPLES = [example for page in CURL_PAGES for example in curl_examples(page)]


@pytest.mark.parametrize(("where", "command", "shown"), CURL_EXAMPLES, ids=[e[0] for e in CURL_EXAMPLES])
def test_a_curl_example_answers_as_shown(example_server, where, command, shown):
    if re.search(r"curl -s?N\b", command):
        pytest.skip("a stream: its pieces depend on the generated text (tests/integration/test_generator_api.py)")
    server, folder = example_server(model_of(command))
    command = DOC_HOST.sub(server.inference_url, command).replace("python3 -c", f"{sys.executable} -c")
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, cwd=folder)
    assert result.returncode == 0, f"{where}: {command}\n{result.stderr}"
    served, status = result.stdout.strip(), None
    if match := STATUS.search(shown):
        shown, status = shown[: match.start()], match.group(1)
        assert STATUS.search(served) and STATUS.search(served).group(1) == status, f"{where}: {served}"
        served = STATUS.sub("", served)
    problems = same_shape(json.loads(with_elisions(shown)), json.loads(served))
    assert not problems, f"{where}: {command}\nserved: {served}\n" + "\n".join(problems)


SNIPPETS = [snippet for page in SNIPPET_PAGES for snippet in python_snippets(page)]
NUMBER = re.compile(r"-?\d+\.\d+(?:e-?\d+)?")
QUOTED = re.compile(r"'[^'\n]*'")


@pytest.mark.cpu_kind  # what a snippet prints must hold on every kind of CPU (make test runs it as avx2 too)
@pytest.mark.parametrize(("where", "code", "shown"), SNIPPETS, ids=[s[0] for s in SNIPPETS])
def test_a_python_snippet_prints_what_is_shown(example_server, where, code, shown):
    server, folder = example_server(model_of(code))
    code = DOC_HOST.sub(server.inference_url, code)
    # As a user runs it: the tests' offline switches would make huggingface_hub refuse even a local URL.
    env = {key: value for key, value in os.environ.items() if key not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    argv = [sys.executable, "-c", code]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=folder, env=env)
    assert result.returncode == 0, f"{where}:\n{code}\n{result.stderr}"
    assert prints_as_shown(result.stdout, shown), f"{where}: printed\n{result.stdout}\nthe docs show\n{shown}"


# The start of a base64 string printed cut short ("TO+CPAIfSrw/hGq9SfOpPSrd..."): Cohere's base64 type is the float
# vector's bytes, so it differs between CPUs as the floats do.
BASE64_PREFIX = re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{16,}(?=\.\.\.)")


def masked(output):
    return BASE64_PREFIX.sub("<base64>", NUMBER.sub("<float>", QUOTED.sub("<str>", output.strip())))


# A line that prints int8/uint8 embeddings, and the integers listed in it.
QUANTIZED_LINE = re.compile(r"\bu?int8\b")
LISTED_INT = re.compile(r"(?<=[\[ ])-?\d+(?=[,\]])")


def prints_as_shown(printed, shown):
    """Floats (and the base64 of their bytes) may differ in their last digits between CPUs and generated text in its
    characters (the demo generator's weights are random); int8/uint8 values, quantized from floats that differ so, may
    land one step apart (127 on an AVX512-BF16 EPYC printed 126 as TS_CPU_AS=avx2, and on an AVX2 EPYC). Every other
    character must be as shown."""
    printed_lines, shown_lines = masked(printed).splitlines(), masked(shown).splitlines()
    if len(printed_lines) != len(shown_lines):
        return False
    for line, expected in zip(printed_lines, shown_lines, strict=True):
        if line == expected:
            continue
        if not QUANTIZED_LINE.search(expected) or LISTED_INT.sub("<int>", line) != LISTED_INT.sub("<int>", expected):
            return False
        steps = [
            abs(int(a) - int(b)) for a, b in zip(LISTED_INT.findall(line), LISTED_INT.findall(expected), strict=True)
        ]
        if max(steps, default=0) > 1:
            return False
    return True


def test_quantized_values_may_land_one_step_apart_and_nothing_else_may():
    shown = (
        "384 [0.015983246, -0.0123]\n384 [13, -45, 127] uint8: [141, 83, 255]\n48 [21, -88] ubinary: [149, 40]\n"
        "TO+CPAIfSrw/hGq9SfOpPSrd... input_tokens=18.0"
    )
    other_cpu = shown.replace("0.015983246", "0.0159831").replace("127]", "126]").replace("255]", "254]")
    assert prints_as_shown(other_cpu.replace("TO+CPAIfSrw/hGq9SfOpPSrd", "VNODPIGQR7wzHGu9Z5KpPfjL"), shown)
    assert not prints_as_shown(shown.replace("input_tokens=18.0", "input_tokens=19.0 x"), shown)
    assert not prints_as_shown(shown.replace("127]", "125]"), shown)  # two steps
    assert not prints_as_shown(shown.replace("384 [13", "383 [13"), shown)  # a length, not a listed value
    assert not prints_as_shown(shown.replace("[21,", "[20,"), shown)  # binary: packed bits, exact
    assert not prints_as_shown(shown + "\nmore", shown)


def test_the_examples_are_found():
    # A change to the docs' layout must not silently leave nothing to run.
    assert len(CURL_EXAMPLES) >= 20 and any(where.startswith("README.md") for where, _, _ in CURL_EXAMPLES)
    assert len(SNIPPETS) >= 4
