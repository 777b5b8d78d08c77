"""The OpenVINO decoding-step measurement's own logic (loadtests/generator_openvino.py): the paged-attention block
tables and pass inputs it builds, and its command line. The measurements themselves need the optional venv and a
model export (minutes), so they are not run here."""

import pytest

from loadtests import generator_openvino as gov


def test_pass_inputs_describe_each_rows_blocks_and_flattened_part():
    tables = gov.BlockTables(block_size=4, blocks=8)
    first, second = tables.add_row(), tables.add_row()
    prompts = tables.pass_inputs([first, second], [6, 3])  # 6 tokens need 2 blocks, 3 tokens 1
    assert prompts["past_lens"].tolist() == [0, 0]
    assert prompts["subsequence_begins"].tolist() == [0, 6, 9]
    assert prompts["block_indices"].tolist() == [0, 1, 2]
    assert prompts["block_indices_begins"].tolist() == [0, 2, 3]
    assert int(prompts["max_context_len"]) == 6
    step = tables.pass_inputs([first, second], [1, 1])  # 7 tokens still fit 2 blocks; the second row fits its one
    assert step["past_lens"].tolist() == [6, 3]
    assert step["subsequence_begins"].tolist() == [0, 1, 2]
    assert step["block_indices"].tolist() == [0, 1, 2]
    assert int(step["max_context_len"]) == 7
    grown = tables.pass_inputs([second], [2])  # only the second row, crossing into a new block
    assert grown["past_lens"].tolist() == [4]
    assert grown["block_indices"].tolist() == [2, 3]
    assert grown["block_indices_begins"].tolist() == [0, 2]
    assert tables.lengths == [7, 6]


def test_a_leaving_rows_blocks_are_reused():
    tables = gov.BlockTables(block_size=2, blocks=3)
    first, second = tables.add_row(), tables.add_row()
    tables.pass_inputs([first, second], [4, 2])
    with pytest.raises(MemoryError):
        tables.pass_inputs([second], [1])  # the pool is full
    tables.drop_row(first)
    assert tables.lengths == [2]
    again = tables.pass_inputs([0], [2])
    assert again["block_indices"].tolist()[0] == 2 and len(again["block_indices"]) == 2
    assert set(again["block_indices"].tolist()) <= {0, 1, 2}


@pytest.mark.parametrize(("rows", "counts"), [([0], [0]), ([0, 0], [1, 1]), ([1], [1]), ([0], [1, 2])])
def test_pass_inputs_refuse_bad_rows(rows, counts):
    tables = gov.BlockTables(block_size=4, blocks=4)
    tables.add_row()
    with pytest.raises(ValueError):
        tables.pass_inputs(rows, counts)


def test_positions_follow_each_rows_cached_tokens():
    assert gov.positions([0, 5], [3, 1]) == [0, 1, 2, 5]
    assert gov.cumulative([3, 1, 2]) == [0, 3, 4, 6]


def test_prompts_are_the_same_in_every_process():
    one, again = gov.prompts(3, 5, 100), gov.prompts(3, 5, 100)
    assert one == again and len(one) == 3 and all(len(row) == 5 and max(row) < 100 for row in one)
    assert gov.prompts(3, 5, 100, seed=1) != one


def test_command_line():
    args = gov.parse_args(["--rows", "2,16", "--precisions", "bf16", "--parts", "step"])
    assert (args.rows, args.precisions, args.parts) == ([2, 16], ["bf16"], ["step"])
    for bad in (["--rows", "0"], ["--rows", "x"], ["--precisions", "fp16"], ["--parts", "serve"],
                ["--context", "1000", "--max-new-tokens", "64"], ["--threads", "0"]):  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            gov.parse_args(bad)
        assert exit_info.value.code == 2


def test_a_missing_venv_says_how_to_create_it(monkeypatch, capsys):
    monkeypatch.setattr(type(gov.openvino_env()), "ready", lambda self: False)
    assert gov.main(["--parts", "step"]) == 1
    assert "python -m loadtests.baselines.baseline_env openvino-gen" in capsys.readouterr().err


def test_token_agreement_stops_counting_a_row_at_its_first_difference():
    assert gov.token_agreement([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 5, 6]]) == 1.0
    assert gov.token_agreement([[1, 2, 3], [4, 5, 6]], [[1, 9, 3], [4, 5, 6]]) == 0.667  # 1 + 3 of 6
    assert gov.token_agreement([[1, 2]], [[7, 2]]) == 0.0
