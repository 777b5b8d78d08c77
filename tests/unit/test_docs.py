"""The docs cannot drift: README.md and docs/*.md checked against the code (scripts/docs_check.py), and the checker
itself shown to catch each kind of mistake, so it cannot rot into passing everything."""

import pytest

from scripts import docs_check
from scripts.docs_check import VENV_NOTE, check_texts

NOTE = f"> Commands run in the activated environment: [Running the tools](../{VENV_NOTE}).\n\n"


def test_the_docs_say_what_the_code_does():
    problems = docs_check.check()
    assert not problems, "docs out of step with the code (python -m scripts.docs_check):\n" + "\n".join(
        map(str, problems)
    )


def problems_of(text, file="docs/planted.md"):
    return [str(problem) for problem in check_texts({file: text})]


def test_a_correct_page_passes():
    page = NOTE + (
        "`make serve`, then `python -m scripts.modelctl register classifier.mar --batch-size 8`; "
        "`handler.max_inputs` lives in `models/minilm/model-config.yaml`.\n"
    )
    assert problems_of(page) == []


@pytest.mark.parametrize(
    ("planted", "found"),
    [
        ("`python -m scripts.modelctl register classifier.mar --batch-sise 8`", "has no option --batch-sise"),
        ("`python -m scripts.modelctl --help-me`", "has no option --help-me"),
        ("`python -m scripts.no_such_tool`", "no such module"),
        ("`make serve-everything`", "no target 'serve-everything'"),
        ("`models/minilm/model-konfig.yaml`", "does not exist in the repository"),
        ("set handler.max_inputz to 8", "handler.max_inputz: no handler has this option"),
        ("set handler.shared_cache.adress", "shared_cache has no field 'adress'"),
        ("the checkout in /home/someone/project", "one machine's path"),
        ("as issue 12 said", "project's voice"),
        ("see [the guide](serving.md#no-such-heading)", "has no heading #no-such-heading"),
        ("see [the guide](no-such-page.md)", "no such file"),
        ("`python -m scripts.package text-model --config maxWorkerz=4`", "not a TorchServe model-config key"),
        ("`python -m scripts.package text-model --config handler.max_inputz=4`", "no handler has this option"),
        ("`grep 'minilm 1.0 ready on cpu: precision=' logs/model_log.log`", "a worker's ready line reads"),
    ],
)
def test_each_kind_of_mistake_is_caught(planted, found):
    problems = problems_of(NOTE + planted + "\n")
    assert any(found in problem for problem in problems), problems


def test_a_changed_shipped_value_is_caught():
    # The classifier ships maxBatchDelay 1 and batchSize 16 (models/classifier/model-config.yaml).
    good = NOTE + "Shipped (`models/classifier/model-config.yaml`): 1 worker, `batchSize: 16`, `maxBatchDelay: 1` ms.\n"
    assert problems_of(good) == []
    stale = good.replace("`maxBatchDelay: 1`", "`maxBatchDelay: 5`").replace("1 worker", "3 workers")
    problems = problems_of(stale)
    assert any("maxBatchDelay 5: classifier ships [1]" in p for p in problems), problems
    assert any("workers 3: classifier ships [1]" in p for p in problems), problems
    # A model's describe output shown in a block is held to the same values.
    output = NOTE + "```\nclassifier 1.0 (default)\n  batching  batchSize 16, maxBatchDelay 5 ms\n```\n"
    assert any("maxBatchDelay 5: classifier ships [1]" in p for p in problems_of(output))


def test_a_model_config_shown_as_yaml_names_known_keys():
    block = (
        "```yaml\nbatchSize: 8\nmaxBatchDelai: 1\nhandler:\n  threads: 1\n  shared_cache: {url: '', tll_s: 5}\n```\n"
    )
    problems = problems_of(NOTE + block)
    assert any("'maxBatchDelai'" in p for p in problems), problems
    assert any("shared_cache has no field 'tll_s'" in p for p in problems), problems
    section = "```yaml\n  cache_size: 4096\n  cache_sise: 1\n```\n"
    assert any("'cache_sise'" in p for p in problems_of(NOTE + section))


def test_a_default_column_is_the_codes_default():
    table = "<!-- defaults: handlers/embeddings.py -->\n| key | default | meaning |\n|---|---|---|\n"
    rows = "| `cache_size` | `4096` | rows |\n| `shared_cache` | `{url: ''}` | off |\n"
    assert problems_of(NOTE + table + rows) == []
    shipped_not_default = problems_of(NOTE + table + "| `shared_cache` | `{url: redis://127.0.0.1:6390/0}` | |\n")
    assert any("`shared_cache` default is" in p for p in shipped_not_default), shipped_not_default
    assert any("no such option" in p for p in problems_of(NOTE + table + "| `cache_sise` | `4096` | |\n"))


def test_a_request_field_table_matches_the_schema():
    table = (
        "<!-- request-fields: handlers.generation.native:FIELDS! -->\n| field | type |\n| --- | --- |\n"
        "| `prompt` | string |\n| `max_tokens` | integer |\n"
    )
    problems = problems_of(NOTE + table)
    assert any("request field `max_tokens`" in p for p in problems), problems
    assert any("are not in the table" in p for p in problems), problems


def test_a_generated_table_that_changed_is_caught():
    stale = "<!-- shipped-config -->\n| model | workers |\n|---|---|\n| minilm | 9-9 |\n<!-- /shipped-config -->\n"
    assert any("is stale" in p for p in problems_of(NOTE + stale))


def test_python_m_commands_need_the_environment_note():
    problems = problems_of("Run `python -m scripts.modelctl list`.\n")
    assert any("activated-environment note" in p for p in problems), problems
