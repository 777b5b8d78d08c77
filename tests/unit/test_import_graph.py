"""python -m scripts.import_graph: handlers/ has no import circle and imports nothing of the project's tools; and the
check itself finds a circle hidden behind an import inside a function, so it cannot rot into passing everything."""

import json
import subprocess
import sys
import textwrap

from scripts import import_graph


def test_handlers_have_no_import_circle_and_no_tool_import():
    findings = import_graph.check()
    assert findings == {"circles": [], "forbidden": []}, import_graph.report(findings)


def plant(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_a_circle_hidden_in_a_function_is_found(tmp_path):
    plant(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low.py": """
                def helper():
                    from pkg.high import thing  # hides the circle until called
                    return thing
            """,
            "pkg/high.py": "from . import low\n\nthing = 1\n",
            "pkg/leaf.py": "from pkg import low\n",  # imports into the circle, is not part of it
        },
    )
    findings = import_graph.check(tmp_path, "pkg")
    assert [circle["modules"] for circle in findings["circles"]] == [["pkg.high", "pkg.low"]]
    lines = {(e["file"], e["line"], e["in_function"]) for e in findings["circles"][0]["imports"]}
    assert lines == {("pkg/low.py", 3, True), ("pkg/high.py", 1, False)}
    text = import_graph.report(findings)
    assert "pkg/low.py:3: from pkg.high import thing" in text and "(inside a function)" in text


def test_type_checking_imports_are_not_edges_and_package_inits_are(tmp_path):
    plant(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
            "pkg/b.py": "import pkg.a\n",
            # importing pkg.sub.x runs pkg/sub/__init__.py, which imports pkg.c: a circle through the package
            "pkg/sub/__init__.py": "from pkg import c\n",
            "pkg/sub/x.py": "",
            "pkg/c.py": "from pkg.sub import x\n",
        },
    )
    findings = import_graph.check(tmp_path, "pkg")
    assert [circle["modules"] for circle in findings["circles"]] == [["pkg.c", "pkg.sub"]]


def test_imports_of_the_tools_are_reported_and_the_cli_exits_1(tmp_path):
    plant(tmp_path, {"pkg/__init__.py": "", "pkg/m.py": "def f():\n    from scripts.server import main\n"})
    result = subprocess.run(
        [sys.executable, "-m", "scripts.import_graph", "--root", str(tmp_path), "--package", "pkg", "--json"],
        capture_output=True,
        text=True,
        cwd=import_graph.ROOT,
    )
    assert result.returncode == 1
    forbidden = json.loads(result.stdout)["forbidden"]
    assert [(e["file"], e["target"], e["in_function"]) for e in forbidden] == [("pkg/m.py", "scripts.server", True)]


# The layers of handlers/ that are held to more than "no circle": each may import only the packages listed (besides
# itself), so an engine meant to stand on the core alone cannot quietly lean on another model family.
LAYERS = {"handlers.network": {"handlers.core"}}


def within(module, package):
    return module == package or module.startswith(f"{package}.")


def layer_violations(root=import_graph.ROOT):
    edges, _ = import_graph.scan(root, import_graph.PACKAGE)
    lines = [
        f"{edge.file}:{edge.line}: {edge.text}"
        for layer, allowed in LAYERS.items()
        for edge in edges
        if within(edge.source, layer) and not any(within(edge.target, p) for p in {layer, *allowed})
    ]
    return list(dict.fromkeys(lines))  # one line per import statement (it may reach a package and its module)


def test_each_layer_imports_only_what_it_may():
    assert layer_violations() == []


def test_the_layer_check_finds_an_import_of_another_family(tmp_path):
    plant(
        tmp_path,
        {
            "handlers/__init__.py": "",
            "handlers/core/__init__.py": "",
            "handlers/text/__init__.py": "",
            "handlers/text/y.py": "",
            "handlers/network/__init__.py": "from handlers import core\n",
            "handlers/network/x.py": "def f():\n    from handlers.text import y\n",
        },
    )
    assert layer_violations(tmp_path) == ["handlers/network/x.py:2: from handlers.text import y"]
