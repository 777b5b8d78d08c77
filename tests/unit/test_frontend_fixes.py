"""scripts/frontend_fixes: the patch of TorchServe 0.12.0's model-server.jar (the served behaviour is checked against a
real TorchServe in tests/integration/test_management_safety.py)."""

import shutil
import zipfile

import pytest

from scripts.frontend_fixes import __main__ as fixes
from scripts.frontend_fixes.classfile import ClassFile, ClassFileError


@pytest.fixture(scope="module")
def original_jar():
    """The jar as the torchserve 0.12.0 wheel ships it: `make install` keeps it beside the patched one."""
    installed = fixes.installed_jar()
    backup = installed.with_name(installed.name + ".orig")
    jar = backup if backup.is_file() else installed
    if fixes.sha256(jar) != fixes.ORIGINAL_SHA256:
        pytest.fail(f"{jar} is not torchserve 0.12.0's jar: reinstall (make install)")
    return jar


@pytest.fixture(scope="module")
def patched(original_jar, tmp_path_factory):
    jar = tmp_path_factory.mktemp("jar") / "model-server.jar"
    shutil.copyfile(original_jar, jar)
    assert "applied" in fixes.patch(jar, log=lambda _: None)
    return jar


def calls_of(jar, entry, owner, name):
    """How many calls of owner.name (any descriptor) the class ``entry`` of ``jar`` makes."""
    with zipfile.ZipFile(jar) as archive:
        parsed = ClassFile.parse(archive.read(entry))
    count = 0
    for method in parsed.methods():
        for offset, opcode in parsed.instructions(method):
            if opcode in (0xB6, 0xB8):
                ref = parsed.method_ref(int.from_bytes(parsed.data[offset + 1 : offset + 3], "big"))
                count += bool(ref and ref[0] == owner and ref[1] == name)
    return count


def test_every_redirected_call_goes_to_the_fixes_and_none_is_left(original_jar, patched):
    for redirect in fixes.REDIRECTS:
        owner, name, _ = redirect.target
        before = calls_of(original_jar, redirect.entry, owner, name)
        assert calls_of(patched, redirect.entry, fixes.FIXES_CLASS, redirect.name) >= redirect.expected
        if redirect.method == "*":
            assert calls_of(patched, redirect.entry, owner, name) == 0
        else:
            assert calls_of(patched, redirect.entry, owner, name) == before - redirect.expected


def test_the_patched_jar_carries_the_fixes_class_and_its_marker(patched):
    with zipfile.ZipFile(patched) as archive:
        names = set(archive.namelist())
        assert f"{fixes.FIXES_CLASS}.class" in names
        assert archive.read(f"{fixes.FIXES_CLASS}.class")[:4] == b"\xca\xfe\xba\xbe"
    assert fixes.marker(patched)["digest"] == fixes.fixes_digest()
    assert fixes.main(["--jar", str(patched), "--check"]) == 0


def test_patching_again_changes_nothing(patched):
    before = fixes.sha256(patched)
    assert "already applied" in fixes.patch(patched)
    assert fixes.sha256(patched) == before


def test_an_unknown_jar_is_refused_and_left_as_it_was(tmp_path, capsys):
    jar = tmp_path / "model-server.jar"
    with zipfile.ZipFile(jar, "w") as archive:
        archive.writestr("org/pytorch/serve/ModelServer.class", b"\xca\xfe\xba\xbe not really")
    before = fixes.sha256(jar)
    assert fixes.main(["--jar", str(jar)]) == 2
    assert "not torchserve 0.12.0" in capsys.readouterr().err
    assert fixes.sha256(jar) == before and not jar.with_name("model-server.jar.orig").exists()
    assert fixes.main(["--jar", str(jar), "--check"]) == 1


def test_every_method_of_the_patched_classes_decodes_to_its_exact_length(patched):
    """The instruction walk (opcode lengths, switches, wide) ends exactly at each method's end."""
    with zipfile.ZipFile(patched) as archive:
        for entry in {redirect.entry for redirect in fixes.REDIRECTS}:
            parsed = ClassFile.parse(archive.read(entry))
            for method in parsed.methods():
                offsets = [offset for offset, _ in parsed.instructions(method)]
                assert offsets[0] == method.code_start and offsets[-1] < method.code_start + method.code_length


def test_bytes_that_are_not_a_class_file_are_refused():
    with pytest.raises(ClassFileError):
        ClassFile.parse(b"PK\x03\x04 a zip, not a class")
