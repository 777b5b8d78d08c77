"""Check that README.md and docs/*.md say only what the code does: the docs cannot drift.

    python -m scripts.docs_check [--json]

What is checked, against the code itself (each problem is printed as ``file:line: what``):

- every ``make <target>`` named in a code span or block is a target of the Makefile;
- every ``python -m <module> [<subcommand>] --flag ...`` names a module of this repository, and each flag is one its
  command line offers (read from its own ``--help``, the subcommand's where one is named);
- every ``handler.<key>`` is an option of a handler's ``handler:`` schema (the nested keys of a structured option too);
- every repository path in a code span (``handlers/text/kinds/base.py``, ``models/minilm/model-config.yaml``) exists;
- no machine's own absolute path (a home or a checkout's folder) is shown as what a user will see;
- a generated table (``<!-- options: handlers/text_model.py -->`` ... ``<!-- /options -->``: the option schema of an
  entry module's handler; ``<!-- shipped-config -->`` ... ``<!-- /shipped-config -->``: the bundled models' TorchServe
  values) is exactly what the code renders now, defaults and shipped values included;
- the guide speaks in the project's own voice: no issue numbers, no "this session" or "this change" (the record of
  measurements, docs/results.md, is dated and keeps its history).

What it cannot check: that prose describes behaviour truly, and numbers in the record (each comes with the command
and date that produced it). Examples with their output are run against a real server by
tests/integration/test_docs_examples.py.

Exit codes: 0 no problem, 1 problems found, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECORD = "docs/results.md"  # the dated record of measurements: history is allowed there
# Handler entry modules whose ``handler:`` schema the docs may name.
ENTRY_MODULES = ("handlers/classifier.py", "handlers/text_model.py", "handlers/generator.py")
# A repository path: a known top-level folder, then path characters (a trailing slash names a folder).
PATH = re.compile(
    r"^(?:handlers|scripts|loadtests|tests|models|docs|config|deploy|\.ci)/[A-Za-z0-9_./<>*-]*$|^(?:Makefile|README\.md|"
    r"requirements\.txt|pyproject\.toml|config\.properties)$"
)
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|home|root|Users)/[\w./-]+")
VOICE = re.compile(r"\bissues? \d+\b|\bthis (?:session|stop)\b|\bthis change\b", re.IGNORECASE)
COMMAND = re.compile(r"python3? -m ([a-z_][a-z0-9_.]*)((?:[ \t]+(?:\\\n)?[^\s`|;&]+)*)")
MAKE = re.compile(r"\bmake ([a-z][a-z0-9-]*)")
# handler.KEY (or handler.KEY.FIELD) as a config key: not a file (text/handler.py), not a call or an attribute chain.
HANDLER_KEY = re.compile(r"(?<![\w/])handler\.([a-z_]+)(?:\.([a-z_]+))?(?![\w.(])")
# Folders a run writes into (reports, builds, logs): named in the docs, absent from a fresh checkout.
GENERATED_PATHS = ("loadtests/reports", "build/", "logs/", "model_store/")
KNOWN_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".json", ".properties", ".txt", ".sh", ".xml", ".toml", ".j2"}
SPAN = re.compile(r"`([^`\n]+)`")


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.what}"


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def code_parts(text: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of every fenced block line and every inline code span."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            yield number, line
        else:
            for span in SPAN.findall(line):
                yield number, span


def join_continuations(text: str) -> str:
    """Each backslash-continued command on its first line (the lines it took stay, empty, so numbers hold)."""
    lines = text.splitlines()
    for index in range(len(lines)):
        while lines[index].endswith("\\") and index + 1 < len(lines):
            following = next((i for i in range(index + 1, len(lines)) if lines[i]), None)
            if following is None:
                break
            lines[index] = lines[index][:-1] + " " + lines[following].strip()
            lines[following] = ""
    return "\n".join(lines)


def commands(text: str) -> Iterator[tuple[int, str, list[str]]]:
    """(line, module, arguments) of each ``python -m`` command, continuation lines joined."""
    for number, part in code_parts(join_continuations(text)):
        for match in COMMAND.finditer(part):
            if not match.group(1).endswith("."):  # "python -m scripts.<name>": a placeholder
                yield number, match.group(1), [a.strip("[]") for a in match.group(2).split()]


# ----------------------------------------------------------------------------------------------- the checks
def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([a-z][a-z0-9-]*):", text, re.MULTILINE))


def check_make(file: str, text: str, targets: set[str]) -> list[Problem]:
    return [
        Problem(file, number, f"`make {target}`: the Makefile has no target {target!r}")
        for number, part in code_parts(text)
        for target in MAKE.findall(part)
        if target not in targets
    ]


def module_file(module: str) -> Path | None:
    path = REPO / Path(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__main__.py"):
        if candidate.is_file():
            return candidate
    return None


def help_flags(module: str, subcommand: str | None) -> tuple[set[str], set[str]] | str:
    """(flags, subcommands) a module's --help lists (its subcommand's when given), or why it could not be read."""
    argv = [sys.executable, "-m", module, *([subcommand] if subcommand else []), "--help"]
    try:
        result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "its --help did not answer within 120 s"
    if result.returncode != 0:
        return f"its --help failed: {(result.stderr or result.stdout).strip().splitlines()[-1:]}"
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", result.stdout))
    choices = re.search(r"\{([a-z0-9_,-]+)\}", result.stdout)
    listed = re.findall(r"^ {4}([a-z][a-z0-9_-]*)(?: {2,}|$)", result.stdout, re.MULTILINE)  # a metavar's listing
    return flags, set(choices.group(1).split(",") if choices else []) | set(listed)


def check_commands(documents: dict[str, str]) -> list[Problem]:
    found: list[tuple[str, int, str, list[str]]] = [
        (file, number, module, arguments)
        for file, text in documents.items()
        for number, module, arguments in commands(text)
        if module.split(".")[0] in ("scripts", "loadtests", "tests")
    ]
    problems = [
        Problem(file, number, f"`python -m {module}`: no such module in the repository")
        for file, number, module, _ in found
        if module_file(module) is None
    ]
    found = [item for item in found if module_file(item[2]) is not None]
    wanted = {(module, None) for _, _, module, _ in found}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        helps = dict(zip(wanted, pool.map(lambda key: help_flags(*key), wanted), strict=True))
        subcommands = {
            (module, args[0])
            for _, _, module, args in found
            if args and not isinstance(helps[(module, None)], str) and args[0] in helps[(module, None)][1]
        }
        helps.update(zip(subcommands, pool.map(lambda key: help_flags(*key), subcommands), strict=True))
    for file, number, module, arguments in found:
        top = helps[(module, None)]
        if isinstance(top, str):
            problems.append(Problem(file, number, f"`python -m {module}`: {top}"))
            continue
        sub = arguments[0] if arguments and arguments[0] in top[1] else None
        offered = top[0] | (helps[(module, sub)][0] if sub and not isinstance(helps[(module, sub)], str) else set())
        for flag in (a.split("=")[0] for a in arguments if a.startswith("--")):
            if flag not in offered:
                where = f"{module} {sub}" if sub else module
                problems.append(Problem(file, number, f"`python -m {where}` has no option {flag}"))
    return problems


def handler_keys() -> dict[str, set[str]]:
    """Every handler option key -> its nested field names (empty for a plain value)."""
    from scripts.ops.handler_loader import entry_class

    keys: dict[str, set[str]] = {}
    for path in ENTRY_MODULES:
        for key, option in entry_class(path).options.items():
            nested = set(option.default) if isinstance(option.default, dict) else set()
            keys.setdefault(key, set()).update(nested)
    return keys


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line outside fenced blocks (code there may name a Python object ``handler``)."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield number, line


def check_handler_keys(file: str, text: str, keys: dict[str, set[str]]) -> list[Problem]:
    problems = []
    for number, line in prose_lines(text):
        for key, field in HANDLER_KEY.findall(line):
            if key == "py":  # handler.py, a file
                continue
            if key not in keys:
                problems.append(Problem(file, number, f"handler.{key}: no handler has this option"))
            elif field and keys[key] and field not in keys[key]:
                problems.append(Problem(file, number, f"handler.{key}.{field}: {key} has no field {field!r}"))
    return problems


def check_paths(file: str, text: str) -> list[Problem]:
    problems = []
    for number, part in code_parts(text):
        for token in part.split() if "\n" not in part else []:
            token = token.strip("(),:;'\"[]").split("#")[0].split(":")[0]
            if not PATH.match(token) or any(mark in token for mark in "<>*") or "..." in token:
                continue
            last = token.rstrip("/").rsplit("/", 1)[-1]
            if "." in last and Path(last).suffix not in KNOWN_SUFFIXES:  # a module.attribute, not a file
                continue
            if token.startswith(GENERATED_PATHS):
                continue
            if not (REPO / token).exists():
                problems.append(Problem(file, number, f"`{token}` does not exist in the repository"))
    return problems


def check_machine_paths(file: str, text: str) -> list[Problem]:
    return [
        Problem(file, number, f"{match.group(0)} is one machine's path: show it relative to the checkout")
        for number, line in enumerate(text.splitlines(), start=1)
        for match in MACHINE_PATH.finditer(line)
    ]


def check_voice(file: str, text: str) -> list[Problem]:
    if file == RECORD:
        return []
    return [
        Problem(file, number, f"{match.group(0)!r}: the guide speaks in the project's voice, not a work log's")
        for number, line in enumerate(text.splitlines(), start=1)
        for match in VOICE.finditer(line)
    ]


GENERATED = re.compile(r"<!-- (options: [\w/.]+|shipped-config) -->\n(.*?)<!-- /(?:options|shipped-config) -->", re.S)


def rendered(kind: str) -> str:
    """What a generated table must hold now."""
    if kind.startswith("options: "):
        from handlers.core.config import options_table
        from scripts.ops.handler_loader import entry_class

        return options_table(entry_class(kind.removeprefix("options: ")).options)
    return shipped_config_table()


def shipped_config_table() -> str:
    """The bundled models' TorchServe values, as their model-config.yaml ship them (the per-CPU values noted)."""
    import yaml

    lines = [
        "| model | workers | batchSize | maxBatchDelay | responseTimeout | per CPU kind |",
        "|---|---|---|---|---|---|",
    ]
    for spec in sorted((REPO / "models").glob("*/model.yaml")):
        meta = yaml.safe_load(spec.read_text()) or {}
        if meta.get("template") or meta.get("optional"):
            continue
        config = yaml.safe_load((spec.parent / meta["config"]).read_text()) or {}
        per_kind = "; ".join(
            f"{kind}: " + ", ".join(f"{key} {value}" for key, value in values.items())
            for kind, values in (config.get("per_cpu_kind") or {}).items()
        )
        lines.append(
            f"| {meta['name']} | {config['minWorkers']}-{config['maxWorkers']} | {config['batchSize']} | "
            f"{config['maxBatchDelay']} ms | {config['responseTimeout']} s | {per_kind or '-'} |"
        )
    return "\n".join(lines) + "\n"


def check_generated(file: str, text: str) -> list[Problem]:
    problems = []
    for match in GENERATED.finditer(text):
        number = text[: match.start()].count("\n") + 1
        try:
            want = rendered(match.group(1))
        except Exception as error:  # a marker naming something that does not exist
            problems.append(Problem(file, number, f"<!-- {match.group(1)} -->: {error}"))
            continue
        if match.group(2).strip() != want.strip():
            problems.append(
                Problem(file, number, f"the generated table <!-- {match.group(1)} --> is stale: regenerate it")
            )
    return problems


def check(files: list[Path] | None = None) -> list[Problem]:
    documents = {str(path.relative_to(REPO)): path.read_text(encoding="utf-8") for path in files or doc_files()}
    targets, keys = make_targets(), handler_keys()
    problems = check_commands(documents)
    for file, text in documents.items():
        problems += check_make(file, text, targets)
        problems += check_handler_keys(file, text, keys)
        problems += check_paths(file, text)
        problems += check_machine_paths(file, text)
        problems += check_voice(file, text)
        problems += check_generated(file, text)
    return sorted(problems, key=lambda p: (p.file, p.line, p.what))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.docs_check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print the problems as JSON")
    parser.parse_args(argv)
    importlib.invalidate_caches()
    problems = check()
    if parser.parse_args(argv).json:
        print(json.dumps([p.__dict__ for p in problems], indent=2))
    else:
        for problem in problems:
            print(problem)
        print(f"{len(problems)} problem(s) in {len(doc_files())} files")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
