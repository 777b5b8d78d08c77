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
- a "default" column under ``<!-- defaults: handlers/<entry>.py [option] -->`` holds the code's defaults (of the
  handler's options, or of one structured option's fields), and names only keys the code has;
- a request-field table under ``<!-- request-fields: package.module:NAME[,NAME] -->`` names only fields those
  collections accept (``!`` after the marker's names: and every one of them);
- a shipped value, ``batchSize``/``maxBatchDelay``/``minWorkers``/``maxWorkers`` (``batchSize: 4``, ``maxBatchDelay
  1 ms``) or "N workers", in a paragraph that says what a bundled model ships (it names
  ``models/<name>/model-config.yaml``, or starts "Shipped" on a page about one model) is that model's value (or one
  of its ``per_cpu_kind`` values);
- a config key ``handler.KEY=...``/``handler.KEY.FIELD`` or a TorchServe key given to ``--config`` exists, and so does
  every key of a model-config shown as a ``yaml`` block (whole, or its ``handler:`` section);
- every relative link to a page of the docs resolves, and its ``#anchor`` is a heading of that page;
- a worker's "ready" log line shown in the docs has the fixed parts, in order, of the line the worker logs;
- a page that shows ``python -m`` commands says at its top that they run in the activated environment (a link to
  README's "Running the tools");
- the guide speaks in the project's own voice: no issue numbers, no "this session" or "this change" (the record of
  measurements, docs/results.md, is dated and keeps its history).

What it cannot check: that prose describes behaviour truly (a limit or a behaviour described in words), numbers in
the record (each comes with the command and date that produced it), shipped values written without their key or a
model-config path nearby, request fields outside a marked table, and output shown for commands it does not run.
Examples with their output are run against a real server by tests/integration/test_docs_examples.py.

Exit codes: 0 no problem, 1 problems found, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import importlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HELP_CACHE = REPO / "build" / "docs-check-help"  # each CLI's --help, per state of the code (build/ is ignored)
RECORD = "docs/results.md"  # the dated record of measurements: history is allowed there
# Handler entry modules whose ``handler:`` schema the docs may name.
ENTRY_MODULES = (
    "handlers/text_model.py",
    "handlers/image_model.py",
    "handlers/generator.py",
    "handlers/network_model.py",
)
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
VENV_NOTE = "README.md#running-the-tools"  # the one place that says how tools run (an activated .venv)
# Pages about one bundled model: a "Shipped ..." paragraph there speaks of it.
PAGE_MODEL = {"docs/embeddings.md": "minilm", "docs/generation.md": "generator", "docs/serving.md": "classifier"}
SERVED_MODELS = ("classifier", "minilm", "generator")  # the models make serve loads, named by their names in prose
SHIPS = re.compile(r"\bship(?:s|ped)?\b|\bas packaged\b", re.IGNORECASE)
SHIPPED_KEYS = ("batchSize", "maxBatchDelay", "minWorkers", "maxWorkers")
SHIPPED_VALUE = re.compile(r"\b(batchSize|maxBatchDelay|minWorkers|maxWorkers)`?:? `?(\d+)")
WORKERS = re.compile(r"\*{0,2}(\d+) workers?\b")
CONFIG_PATH = re.compile(r"models/([a-z0-9-]+)/model-config\.yaml")
LINK = re.compile(r"\]\(([^)\s]+)\)")


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


def code_key() -> str:
    """A hash of everything a command line's --help can depend on: the repository's Python files and the pins."""
    digest = hashlib.sha256()
    for path in sorted([*REPO.glob("[a-z]*/**/*.py"), REPO / "requirements.txt"]):
        if ".venv" not in path.parts and "build" not in path.parts:
            digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def help_text(module: str, subcommand: str | None, cache: Path | None) -> str | None:
    """A module's --help output (its subcommand's when given), None when it failed (the reason printed in its place);
    kept in ``cache`` (keyed on the code) so a rerun with nothing changed starts no Python."""
    name = f"{module}{'.' + subcommand if subcommand else ''}.txt"
    if cache and (cache / name).is_file():
        return (cache / name).read_text()
    argv = [sys.executable, "-m", module, *([subcommand] if subcommand else []), "--help"]
    try:
        result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "error: its --help did not answer within 120 s"
    if result.returncode != 0:
        return f"error: its --help failed: {(result.stderr or result.stdout).strip().splitlines()[-1:]}"
    if cache:
        cache.mkdir(parents=True, exist_ok=True)
        (cache / name).write_text(result.stdout)
    return result.stdout


def help_flags(module: str, subcommand: str | None, cache: Path | None = None) -> tuple[set[str], set[str]] | str:
    """(flags, subcommands) a module's --help lists (its subcommand's when given), or why it could not be read."""
    text = help_text(module, subcommand, cache) or ""
    if text.startswith("error: "):
        return text.removeprefix("error: ")
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))
    choices = re.search(r"\{([a-z0-9_,-]+)\}", text)
    listed = re.findall(r"^ {4}([a-z][a-z0-9_-]*)(?: {2,}|$)", text, re.MULTILINE)  # a metavar's listing
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
    cache = HELP_CACHE / code_key()
    if HELP_CACHE.is_dir():  # only the current code's answers are kept
        for stale in HELP_CACHE.iterdir():
            if stale != cache:
                shutil.rmtree(stale, ignore_errors=True)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        helps = dict(zip(wanted, pool.map(lambda key: help_flags(*key, cache), wanted), strict=True))
        subcommands = {
            (module, args[0])
            for _, _, module, args in found
            if args and not isinstance(helps[(module, None)], str) and args[0] in helps[(module, None)][1]
        }
        helps.update(zip(subcommands, pool.map(lambda key: help_flags(*key, cache), subcommands), strict=True))
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
    from scripts.ops.registry import entry_class

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
        from scripts.ops.registry import entry_class

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


DEFAULTS = re.compile(r"<!-- defaults: ([\w/.]+)(?: (\w+))? -->\n+((?:\|.*\n)+)")
FIELDS_TABLE = re.compile(r"<!-- request-fields: ([\w.]+):([\w,]+)(!?) -->\n+((?:\|.*\n)+)")


def table_rows(table: str) -> Iterator[tuple[int, list[str]]]:
    """(offset in lines, cells) of each body row of a markdown table (the header and its rule skipped)."""
    for offset, line in enumerate(table.splitlines()[2:], start=2):
        yield offset, [cell.strip() for cell in line.strip().strip("|").split("|")]


def same_value(shown: Any, code: Any) -> bool:
    """A documented value against the code's: a mapping shown may name only some of its fields."""
    if isinstance(shown, dict) and isinstance(code, dict):
        return all(key in code and same_value(value, code[key]) for key, value in shown.items())
    return bool(shown == code)


def check_defaults(file: str, text: str) -> list[Problem]:
    import yaml

    from scripts.ops.registry import entry_class

    problems = []
    for match in DEFAULTS.finditer(text):
        first = text[: match.start()].count("\n") + 1
        entry, option, table = match.groups()
        try:
            options = entry_class(entry).options
            defaults = options[option].default if option else {key: o.default for key, o in options.items()}
        except Exception as error:  # a marker naming what does not exist
            problems.append(Problem(file, first, f"<!-- defaults: {entry} {option or ''} -->: {error!r}"))
            continue
        where = f"{entry}{' ' + option if option else ''}"
        for offset, cells in table_rows(table):
            number = first + offset + text[match.start(3) - 1 : match.start(3)].count("\n")
            keys, shown = SPAN.findall(cells[0]), SPAN.findall(cells[1]) if len(cells) > 1 else []
            if not keys:
                continue
            if keys[0] not in defaults:
                problems.append(Problem(file, number, f"`{keys[0]}`: {where} has no such option"))
            elif shown:
                try:
                    value = yaml.safe_load(shown[0])
                except yaml.YAMLError:
                    value = shown[0]
                if not same_value(value, defaults[keys[0]]):
                    problems.append(
                        Problem(
                            file, number, f"`{keys[0]}` default is {defaults[keys[0]]!r} in the code, not {shown[0]}"
                        )
                    )
    return problems


def check_request_fields(file: str, text: str) -> list[Problem]:
    problems = []
    for match in FIELDS_TABLE.finditer(text):
        number = text[: match.start()].count("\n") + 1
        module_name, names, complete, table = match.groups()
        try:
            module = importlib.import_module(module_name)
            accepted = {field for name in names.split(",") for field in getattr(module, name)}
        except Exception as error:
            problems.append(Problem(file, number, f"<!-- request-fields: {module_name}:{names} -->: {error!r}"))
            continue
        named = set()
        for offset, cells in table_rows(table):
            for field in SPAN.findall(cells[0]):
                named.add(field)
                if field not in accepted:
                    problems.append(
                        Problem(file, number + offset + 1, f"request field `{field}`: {module_name} does not accept it")
                    )
        if complete and accepted - named:
            problems.append(Problem(file, number, f"request fields {sorted(accepted - named)} are not in the table"))
    return problems


def shipped_configs() -> dict[str, dict[str, set[int]]]:
    """Each bundled model's shipped TorchServe values (its per_cpu_kind values too), by key."""
    import yaml

    shipped: dict[str, dict[str, set[int]]] = {}
    for path in sorted((REPO / "models").glob("*/model-config.yaml")):
        config = yaml.safe_load(path.read_text()) or {}
        values: dict[str, set[int]] = {key: {config[key]} for key in SHIPPED_KEYS if key in config}
        for overrides in (config.get("per_cpu_kind") or {}).values():
            for key, value in overrides.items():
                values.setdefault(key, set()).add(value)
        shipped[path.parent.name] = values
    return shipped


def paragraphs(text: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of each paragraph of prose; a fenced block is one paragraph with the prose just before it."""
    start, lines = 0, list[str]()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() and lines and not sum(x.lstrip().startswith("```") for x in lines) % 2:
            yield start, "\n".join(lines)
            lines = []
        elif line.strip():
            start = start if lines else number
            lines.append(line)
    if lines:
        yield start, "\n".join(lines)


def check_shipped_values(file: str, text: str, shipped: dict[str, dict[str, set[int]]]) -> list[Problem]:
    if file == RECORD:  # the record keeps what was measured with earlier values, dated
        return []
    problems = []
    for first, paragraph in paragraphs(text):
        named = set(CONFIG_PATH.findall(paragraph)) & set(shipped)
        if not named and paragraph.startswith("Shipped") and file in PAGE_MODEL:
            named = {PAGE_MODEL[file]}
        if not named and (paragraph.lstrip().startswith("```") or SHIPS.search(paragraph)):
            # an output, or a paragraph about what is shipped, that speaks of one served model by its name
            named = {name for name in SERVED_MODELS if re.search(rf"(?<![\w/-]){name}(?![\w/-])", paragraph)}
        if len(named) != 1:  # no model, or several: which one a value belongs to is not clear
            continue
        model = named.pop()
        for offset, line in enumerate(paragraph.splitlines()):
            found = [(key, int(value)) for key, value in SHIPPED_VALUE.findall(line)]
            found += [("workers", int(value)) for value in WORKERS.findall(line)]
            for key, value in found:
                keys = ("minWorkers", "maxWorkers") if key == "workers" else (key,)
                allowed = set().union(*(shipped[model].get(k, set()) for k in keys))
                if allowed and value not in allowed:
                    problems.append(Problem(file, first + offset, f"{key} {value}: {model} ships {sorted(allowed)}"))
    return problems


def check_config_overrides(file: str, text: str, keys: dict[str, set[str]]) -> list[Problem]:
    """``--config KEY=VALUE`` of scripts.package: a TorchServe key or handler.KEY that exists."""
    from scripts.package import TORCHSERVE_KEYS

    problems = []
    for number, part in code_parts(text):
        for key in re.findall(r"--config '?([\w.]+)=", part):
            if key.isupper():  # KEY=VALUE: the placeholder
                continue
            if key.startswith("handler."):
                if key.removeprefix("handler.").split(".")[0] not in keys:
                    problems.append(Problem(file, number, f"--config {key}: no handler has this option"))
            elif key not in TORCHSERVE_KEYS:
                problems.append(Problem(file, number, f"--config {key}: not a TorchServe model-config key"))
    return problems


def yaml_blocks(text: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of each ```yaml block."""
    block: list[str] | None = None
    start = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if block is None and line.strip() == "```yaml":
            block, start = [], number + 1
        elif block is not None and line.strip() == "```":
            yield start, "\n".join(block)
            block = None
        elif block is not None:
            block.append(line)


def check_yaml_configs(file: str, text: str, keys: dict[str, set[str]]) -> list[Problem]:
    """A model-config shown as YAML (whole, or its ``handler:`` section) names only keys the code knows."""
    import textwrap

    import yaml

    from scripts.package import OUR_SECTIONS, TORCHSERVE_KEYS

    problems = []
    for number, block in yaml_blocks(text):
        try:
            config = yaml.safe_load(textwrap.dedent(block))
        except yaml.YAMLError:
            continue
        if not isinstance(config, dict):
            continue
        if set(config) & (set(TORCHSERVE_KEYS) | OUR_SECTIONS):  # a whole model-config.yaml
            problems += [
                Problem(file, number, f"model-config key {key!r}: neither TorchServe's nor a section of ours")
                for key in config
                if key not in TORCHSERVE_KEYS and key not in OUR_SECTIONS
            ]
            handler = config.get("handler") if isinstance(config.get("handler"), dict) else {}
        elif set(config) & set(keys):  # its handler: section alone
            handler = config
        else:
            continue
        for key, value in handler.items():
            if key not in keys:
                problems.append(Problem(file, number, f"handler key {key!r}: no handler has this option"))
            elif isinstance(value, dict) and keys[key]:
                problems += [
                    Problem(file, number, f"handler.{key}.{field}: {key} has no field {field!r}")
                    for field in value
                    if field not in keys[key]
                ]
    return problems


def anchors(text: str) -> set[str]:
    """GitHub's anchors for a page's headings."""
    found = set()
    for _, line in prose_lines(text):
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def check_links(file: str, text: str, documents: dict[str, str]) -> list[Problem]:
    problems = []
    here = (REPO / file).parent
    for number, line in prose_lines(text):
        for target in LINK.findall(line):
            if "://" in target or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            resolved = (here / path).resolve() if path else REPO / file
            if not resolved.exists():
                problems.append(Problem(file, number, f"link {target}: no such file"))
                continue
            if anchor and resolved.suffix == ".md":
                page = str(resolved.relative_to(REPO))
                page_text = documents.get(page) or resolved.read_text(encoding="utf-8")
                if anchor not in anchors(page_text):
                    problems.append(Problem(file, number, f"link {target}: {page} has no heading #{anchor}"))
    return problems


def ready_line_parts() -> list[str]:
    """The fixed parts of the line a worker logs when it is ready (handlers/core/engine.py), in order, up to the
    precision: what a user greps model_log.log for."""
    source = (REPO / "handlers" / "core" / "engine.py").read_text()
    match = re.search(r'"(%s %s ready on [^"]*)"\s*"([^"]*)"', source)
    if not match:
        raise LookupError("handlers/core/engine.py no longer logs '%s %s ready on ...'")
    parts = [part for part in re.split(r"%[-.\d]*[sdf]", match.group(1) + match.group(2)) if part.strip()]
    return parts[:3]  # " ready on ", ": backend=", " precision="


def check_ready_lines(file: str, text: str, parts: list[str]) -> list[Problem]:
    problems = []
    for number, part in code_parts(text):
        found = re.search(re.escape(parts[0]) + r"\S+:", part)  # the line itself, not a search for it
        if not found:
            continue
        line, position = part[found.start() :], 0
        for fixed in parts:
            position = line.find(fixed, position)
            if position < 0:
                want = "%s".join(parts)
                problems.append(Problem(file, number, f"a worker's ready line reads '<name> <version>{want}...'"))
                break
    return problems


def check_venv_note(file: str, text: str) -> list[Problem]:
    """A page with ``python -m`` commands points at the one statement of how tools run (README states it)."""
    if file == "README.md" or VENV_NOTE in text:
        return []
    for number, part in code_parts(text):
        if re.search(r"\bpython3? -m ", part):
            return [
                Problem(
                    file, number, f"shows `python -m` commands without the activated-environment note ({VENV_NOTE})"
                )
            ]
    return []


def check(files: list[Path] | None = None) -> list[Problem]:
    """The problems of README.md and docs/*.md (or of ``files``, inside the repository)."""
    return check_texts({str(path.relative_to(REPO)): path.read_text(encoding="utf-8") for path in files or doc_files()})


def check_texts(documents: dict[str, str]) -> list[Problem]:
    """The problems of pages given as {path relative to the repository: text} (a test plants mistakes this way)."""
    targets, keys, shipped, ready = make_targets(), handler_keys(), shipped_configs(), ready_line_parts()
    problems = check_commands(documents)
    for file, text in documents.items():
        problems += check_make(file, text, targets)
        problems += check_handler_keys(file, text, keys)
        problems += check_defaults(file, text)
        problems += check_request_fields(file, text)
        problems += check_shipped_values(file, text, shipped)
        problems += check_config_overrides(file, text, keys)
        problems += check_yaml_configs(file, text, keys)
        problems += check_links(file, text, documents)
        problems += check_venv_note(file, text)
        problems += check_ready_lines(file, text, ready)
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
