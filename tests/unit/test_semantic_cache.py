"""The generator's similarity cache (handlers/generation/semantic_cache): its index, its options and their hostile
values, its groups, its shared-tier values, and the generator handler with it on, called in process (a tiny random
embedding model stands in for MiniLM, so only identical prompts are similar here; paraphrases with the real model
are tests/integration/test_semantic_cache.py's), against a real Valkey/Redis for the shared tier."""

import json
import shutil
import struct
import time

import pytest
import torch

from handlers.core.config import ConfigError
from handlers.core.errors import RequestError
from handlers.generation.semantic_cache import lexical
from handlers.generation.semantic_cache.cache import exact_terms
from handlers.generation.semantic_cache.options import SEMANTIC_CACHE_OPTION, parse_cache_request
from handlers.generation.semantic_cache.shared import HEADER, SemanticTier, SharedEntry, decode_entry, encode_entry
from handlers.generation.semantic_cache.store import SemanticStore, StoredAnswer
from handlers.generation.semantic_cache.verifier import load_verifier, positive_label
from handlers.text.shared_cache import URL_ENV
from scripts.ops.handler_loader import ChunkRecorder, load_handler, record_metrics, set_requests, statuses

DIM = 8
JSON = {"Content-Type": "application/json"}


def unit(seed, dim=DIM):
    vector = torch.randn(dim, generator=torch.Generator().manual_seed(seed))
    return vector / vector.norm()


def answer(text="an answer", tokens=3):
    return StoredAnswer(text, "length", tokens)


# ----------------------------------------------------------------------------------------------------- the index
class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_lookup_finds_the_most_similar_entry_of_its_group_at_or_above_the_threshold():
    store = SemanticStore(DIM, 100, 1 << 20, 60)
    store.insert(b"g", unit(1), answer("one"))
    store.insert(b"g", unit(2), answer("two"))
    near_two = unit(2) + 0.05 * unit(3)
    near_two /= near_two.norm()
    hit = store.lookup(b"g", near_two, 0.9)
    assert hit is not None and hit.answer.text == "two" and 0.9 <= hit.similarity < 1
    assert store.lookup(b"g", near_two, min(1.0, hit.similarity + 1e-4)) is None  # a stricter threshold misses
    assert store.lookup(b"other group", unit(2), 0.5) is None  # never across groups, even for the same vector


def test_an_identical_vector_is_a_hit_at_threshold_one_despite_float_rounding():
    # A unit vector's dot product with itself is 1 only up to float32 rounding; ~40 % of these fell below 1.0.
    store = SemanticStore(384, 300, 1 << 24, 60)
    vectors = [unit(seed, 384) for seed in range(200)]
    for seed, vector in enumerate(vectors):
        store.insert(str(seed).encode(), vector, answer(str(seed)))
    hits = [store.lookup(str(seed).encode(), vector, 1.0) for seed, vector in enumerate(vectors)]
    assert all(hit is not None and hit.similarity <= 1.0 for hit in hits)


def test_capacity_evicts_the_least_recently_used_and_rows_are_reused():
    store = SemanticStore(DIM, 3, 1 << 20, 60)
    for seed in (1, 2, 3):
        store.insert(b"g", unit(seed), answer(str(seed)))
    assert store.lookup(b"g", unit(1), 0.99).answer.text == "1"  # 1 is now the most recently used
    store.insert(b"g", unit(4), answer("4"))
    assert len(store) == 3 and store.lookup(b"g", unit(2), 0.99) is None  # 2 was the least recently used
    assert [store.lookup(b"g", unit(s), 0.99).answer.text for s in (1, 3, 4)] == ["1", "3", "4"]
    assert len(store.groups[b"g"].entry_ids) == 3  # the freed row was reused, none appended


def test_bytes_bound_evicts_and_an_answer_too_big_for_the_store_is_not_kept():
    store = SemanticStore(DIM, 1000, 2000, 60)
    for seed in range(10):
        store.insert(b"g", unit(seed), answer("x" * 400))
    assert store.nbytes <= 2000 and 0 < len(store) < 10
    assert not store.insert(b"g", unit(99), answer("x" * 5000)) and store.lookup(b"g", unit(99), 0.99) is None


def test_entries_expire_after_the_ttl():
    clock = Clock()
    store = SemanticStore(DIM, 10, 1 << 20, 60, clock=clock)
    store.insert(b"g", unit(1), answer())
    clock.now += 59
    assert store.lookup(b"g", unit(1), 0.99).age_s == pytest.approx(59)
    clock.now += 2
    assert store.lookup(b"g", unit(1), 0.99) is None and len(store) == 0 and not store.groups
    assert not store.insert(b"g", unit(1), answer(), created=clock.now - 61)  # already too old (shared tier)


# ----------------------------------------------------------------------------------------------------- options
def check(value):
    return SEMANTIC_CACHE_OPTION.check("semantic_cache", value)


def test_defaults_fill_in_and_the_shared_tier_is_off():
    settings = check({})
    assert settings["enabled"] == "auto" and settings["threshold"] == 0.89 and settings["exact_terms"] is True
    assert settings["lexical_check"] is True and settings["candidates"] == 4 and settings["verifier"] == "verifier"
    assert settings["shared"]["url"] == "" and settings["shared"]["max_value_bytes"] == 65536


@pytest.mark.parametrize(
    "value, says",
    [
        ({"threshold": float("nan")}, "threshold"),
        ({"threshold": float("inf")}, "threshold"),
        ({"threshold": 1.5}, "threshold"),
        ({"threshold": 0.1}, "threshold"),
        ({"threshold": True}, "threshold"),
        ({"capacity": 0}, "capacity"),
        ({"capacity": 10**9}, "capacity"),
        ({"max_bytes": 10}, "max_bytes"),
        ({"ttl_s": -1}, "ttl_s"),
        ({"enabled": "yes"}, "enabled"),
        ({"embedder": "../elsewhere"}, "embedder"),
        ({"embedder": "/etc"}, "embedder"),
        ({"exact_terms": "no"}, "exact_terms"),
        ({"embedder_handler": {"precison": "bf16"}}, "precison"),
        ({"shared": {"url": "redis://user:secret@host:6379"}}, "password"),
        ({"shared": {"timeout_ms": 0}}, "timeout_ms"),
        ({"nonsense": 1}, "unknown field"),
    ],
)
def test_hostile_settings_are_refused_naming_the_field(value, says):
    with pytest.raises(ConfigError, match=says) as refused:
        check(value)
    assert "secret" not in str(refused.value)


@pytest.mark.parametrize(
    "value, says",
    [
        ({"min_similarity": "0.9"}, "must be a number"),
        ({"min_similarity": True}, "must be a number"),
        ({"min_similarity": float("nan")}, "in \\[0, 1\\]"),
        ({"min_similarity": 1e308 * 10}, "in \\[0, 1\\]"),
        ({"min_similarity": -0.1}, "in \\[0, 1\\]"),
        ({"partition": 7}, "partition"),
        ({"partition": "p" * 129}, "partition"),
        ({"partition": "\ud800"}, "Unicode"),
        ({"mode": "loose"}, "unknown"),
        ([], "true, false or an object"),
        ("yes", "true, false or an object"),
    ],
)
def test_hostile_request_options_are_refused(value, says):
    with pytest.raises(RequestError, match=says):
        parse_cache_request({"semantic_cache": value})


def test_request_options_in_their_accepted_forms():
    assert parse_cache_request({}).use and parse_cache_request({"semantic_cache": None}).use
    assert not parse_cache_request({"semantic_cache": False}).use
    option = parse_cache_request({"semantic_cache": {"min_similarity": 1, "partition": "tenant-a"}})
    assert option.min_similarity == 1.0 and option.partition == "tenant-a"


def test_exact_terms_are_the_numbers_in_digits_or_words_and_the_count_of_negations():
    assert exact_terms("What is 15% of 80?") == exact_terms("What is fifteen percent of eighty?") == "15 80|0"
    assert exact_terms("Which numbers between one and ten are NOT prime?") == "1 10|1"
    assert exact_terms("Why doesn't it start? 1,000 tries") == "1000|1"
    assert exact_terms("How many days in a non-leap year") == "|1"
    assert exact_terms("How do I reset my password?") == exact_terms("How do I get one?") == "|0"


# ----------------------------------------------------------------------------------------------------- shared values
FINGERPRINT = b"\x01" * 8


def shared_entry(created=None, text="answer text"):
    return SharedEntry(b"G" * 16, unit(5), StoredAnswer(text, "stop", 4), created or time.time())


def decode(value, oldest=0.0):
    return decode_entry(value, DIM, FINGERPRINT, 256, oldest)


def test_a_shared_value_round_trips():
    entry = shared_entry(text="é ünïcode ✓")
    decoded = decode(encode_entry(entry, FINGERPRINT))
    assert decoded.group == entry.group and decoded.answer == entry.answer
    assert torch.allclose(decoded.vector, entry.vector) and abs(decoded.created - entry.created) < 0.002


def damaged(value, offset, data):
    return value[:offset] + data + value[offset + len(data) :]


@pytest.mark.parametrize(
    "damage",
    [
        lambda v: b"pickle" + v[6:],  # magic
        lambda v: v[:-1],  # truncated text
        lambda v: v + b"x",  # trailing bytes
        lambda v: damaged(v, 4, b"\x09"),  # format
        lambda v: damaged(v, 5, b"\x07"),  # finish reason
        lambda v: damaged(v, 6, struct.pack("<H", DIM + 1)),  # dimension
        lambda v: damaged(v, 24, b"\x02" * 8),  # another embedder's vectors
        lambda v: damaged(v, 40, struct.pack("<I", 10**6)),  # completion tokens over the model's limit
        lambda v: damaged(v, HEADER.size, struct.pack("<f", float("nan"))),  # non-finite vector
        lambda v: damaged(v, HEADER.size, struct.pack("<f", 3.0)),  # not unit length
        lambda v: damaged(v, len(v) - 2, b"\xff\xfe"),  # not UTF-8
        lambda v: None,
        lambda v: "a string",
    ],
)
def test_a_damaged_or_foreign_shared_value_is_refused(damage):
    assert decode(damage(encode_entry(shared_entry(), FINGERPRINT))) is None


def test_a_shared_value_past_the_ttl_is_refused():
    value = encode_entry(shared_entry(created=time.time() - 100), FINGERPRINT)
    assert decode(value, oldest=time.time() - 50) is None and decode(value, oldest=time.time() - 200) is not None


# ----------------------------------------------------------------------------------------------------- the handler
@pytest.fixture(scope="module")
def cached_generator_dir(prepared_model_dir, tiny_minilm_dir, tmp_path_factory):
    """The demo generator's folder with a (tiny, random) embedding model packed as embedder/."""
    folder = tmp_path_factory.mktemp("cached-generator") / "model"
    shutil.copytree(prepared_model_dir("generator"), folder)
    shutil.copytree(tiny_minilm_dir, folder / "embedder")
    return folder


def load(folder, shared_url="", **semantic):
    settings = {"embedder_handler": {"precision": "fp32", "backend": "eager", "threads": 1}, **semantic}
    settings["shared"] = {"url": shared_url, "timeout_ms": 200, "breaker_cooldown_s": 0.5}
    return load_handler(folder, "generator", {"semantic_cache": settings}, batch_size=4)


@pytest.fixture(scope="module")
def generator(cached_generator_dir):
    return load(cached_generator_dir)


def run(handler, context, bodies, route=""):
    headers = {**JSON, "url_path": route} if route else JSON
    set_requests(context, [headers] * len(bodies))
    handler.stream_sink = ChunkRecorder()
    answers = handler.handle([{"body": body} for body in bodies], context)
    return [a if a.endswith("\n") else json.loads(a) for a in answers]


def ask(generator, **body):
    handler, context = generator
    [result] = run(handler, context, [body])
    return result


def test_the_same_prompt_with_the_same_settings_is_answered_from_the_cache_and_marked(generator):
    prompt = f"a question {time.time_ns()}"
    first = ask(generator, prompt=prompt, max_new_tokens=6)
    again = ask(generator, prompt=prompt, max_new_tokens=6)
    assert "cached" not in first and again["cached"]["similarity"] == pytest.approx(1.0, abs=1e-4)
    assert {k: again[k] for k in first} == first  # the stored answer, with this request's own counts


@pytest.mark.parametrize(
    "change",
    [
        {"max_new_tokens": 7},
        {"temperature": 0.7, "seed": 1},
        {"semantic_cache": {"partition": "another tenant"}},
    ],
)
def test_any_other_setting_or_partition_is_a_different_group(generator, change):
    prompt = f"settings matter {time.time_ns()}"
    ask(generator, prompt=prompt, max_new_tokens=6)
    other = ask(generator, prompt=prompt, **{"max_new_tokens": 6, **change})
    assert "cached" not in other
    assert "cached" in ask(generator, prompt=prompt, **{"max_new_tokens": 6, **change})  # stored in its own group


def test_a_sampled_request_hits_only_with_its_own_seed_and_never_without_one(generator):
    prompt = f"sampled {time.time_ns()}"
    seeded = {"prompt": prompt, "max_new_tokens": 6, "temperature": 1.0}
    first = ask(generator, **seeded, seed=11)
    assert ask(generator, **seeded, seed=11)["cached"] and first["seed"] == 11
    assert "cached" not in ask(generator, **seeded, seed=12)
    assert "cached" not in ask(generator, **seeded) and "cached" not in ask(generator, **seeded)


def test_opting_out_neither_reads_nor_writes(generator):
    prompt = f"opt out {time.time_ns()}"
    assert "cached" not in ask(generator, prompt=prompt, max_new_tokens=5, semantic_cache=False)
    assert "cached" not in ask(generator, prompt=prompt, max_new_tokens=5)  # the opted-out answer was not stored
    assert "cached" not in ask(generator, prompt=prompt, max_new_tokens=5, semantic_cache=False)
    assert "cached" in ask(generator, prompt=prompt, max_new_tokens=5)


def test_a_stricter_threshold_is_honoured_and_a_looser_one_refused(generator):
    handler, context = generator
    refused = ask(generator, prompt="hello", semantic_cache={"min_similarity": 0.5})
    assert statuses(context, 1) == [400] and "only be stricter" in refused["message"]
    prompt = f"strict {time.time_ns()}"
    ask(generator, prompt=prompt, max_new_tokens=4)
    assert ask(generator, prompt=prompt, max_new_tokens=4, semantic_cache={"min_similarity": 1.0})["cached"]


def test_a_batch_mixing_hits_misses_and_errors_answers_each_request_with_its_own(generator):
    handler, context = generator
    prompts = [f"mixed {i} {time.time_ns()}" for i in range(2)]
    firsts = run(handler, context, [{"prompt": p, "max_new_tokens": 5} for p in prompts])
    batch = [
        {"prompt": prompts[1], "max_new_tokens": 5},
        {"prompt": "", "max_new_tokens": 5},
        {"prompt": f"new {time.time_ns()}", "max_new_tokens": 5},
        {"prompt": prompts[0], "max_new_tokens": 5},
    ]
    answers = run(handler, context, batch)
    assert statuses(context, 4) == [200, 400, 200, 200]
    assert answers[0]["text"] == firsts[1]["text"] and answers[3]["text"] == firsts[0]["text"]
    assert "cached" in answers[0] and "cached" in answers[3] and "cached" not in answers[2]
    only_hits = run(handler, context, [batch[0], batch[3]])  # nothing to decode
    assert [a["text"] for a in only_hits] == [firsts[1]["text"], firsts[0]["text"]]


def test_a_streamed_hit_is_one_final_chunk_with_the_whole_text(generator):
    prompt = f"stream me {time.time_ns()}"
    plain = ask(generator, prompt=prompt, max_new_tokens=6)
    streamed = ask(generator, prompt=prompt, max_new_tokens=6, stream=True)
    line = json.loads(streamed)
    assert line["done"] and line["text"] == plain["text"] and line["cached"]["similarity"] > 0.99


def test_chat_hits_only_with_the_same_earlier_messages_and_a_user_message_last(generator):
    handler, context = generator
    route = "v1/chat/completions"
    question = f"what now {time.time_ns()}"

    def chat(system, last_role="user"):
        messages = [{"role": "system", "content": system}, {"role": last_role, "content": question}]
        body = {"messages": messages, "max_tokens": 5, "temperature": 0}
        [result] = run(handler, context, [body], route)
        assert statuses(context, 1) == [200], result
        return result

    first = chat("You are brief.")
    again = chat("You are brief.")
    assert "cached" not in first and again["cached"] and again["choices"] == first["choices"]
    assert "cached" not in chat("You are verbose.")  # another system prompt: another group
    assert "cached" not in chat("You are brief.", last_role="assistant") and "cached" not in chat(
        "You are brief.", last_role="assistant"
    )


def test_metrics_count_hits_misses_and_skips(cached_generator_dir):
    handler, context = load(cached_generator_dir)
    recorder = record_metrics(context)
    prompt = f"metrics {time.time_ns()}"
    run(handler, context, [{"prompt": prompt, "max_new_tokens": 3}])
    run(handler, context, [{"prompt": prompt, "max_new_tokens": 3}, {"prompt": prompt, "semantic_cache": False}])
    assert recorder.values("SemanticCacheMisses") == [1] and recorder.values("SemanticCacheHits") == [1]
    assert recorder.values("SemanticCacheStored") == [1] and recorder.values("SemanticCacheSkipped") == [1]
    assert (
        recorder.values("SemanticCacheEntries")[-1] == 1
        and len(recorder.values("SemanticCacheLookupMilliseconds")) == 2
    )
    described = handler.describe()["semantic_cache"]
    assert described["entries"] == 1 and described["embedder"]["backend"] == "eager"


def test_an_embedding_failure_costs_the_batch_its_lookups_only(cached_generator_dir, monkeypatch):
    handler, context = load(cached_generator_dir)

    def broken(texts):
        raise RuntimeError("embedder down")

    monkeypatch.setattr(handler.semantic.embedder, "embed", broken)
    answers = run(handler, context, [{"prompt": "still answered", "max_new_tokens": 3}] * 2)
    assert statuses(context, 2) == [200, 200] and all("cached" not in a for a in answers)


def test_enabled_true_without_an_embedder_is_refused_at_load_naming_the_fix(prepared_model_dir):
    with pytest.raises(ConfigError, match="--var embedder="):
        load_handler(prepared_model_dir("generator"), "generator", {"semantic_cache": {"enabled": True}})


def test_the_demo_generator_has_no_cache(prepared_model_dir):
    handler, _ = load_handler(prepared_model_dir("generator"), "generator")
    assert handler.semantic is None and handler.describe()["semantic_cache"] is None


# ----------------------------------------------------------------------------------------------------- shared tier
@pytest.fixture(scope="module")
def own_cache(start_cache_server):
    return start_cache_server(name="semantic-unit-cache")


def test_workers_share_answers_through_the_server_and_a_new_worker_reads_the_backlog(
    cached_generator_dir, own_cache, monkeypatch
):
    monkeypatch.delenv(URL_ENV, raising=False)
    first = load(cached_generator_dir, own_cache.url)
    second = load(cached_generator_dir, own_cache.url)
    prompt = f"shared {time.time_ns()}"
    computed = ask(first, prompt=prompt, max_new_tokens=5)
    from_other = ask(second, prompt=prompt, max_new_tokens=5)
    assert from_other["cached"] and from_other["text"] == computed["text"]
    later = load(cached_generator_dir, own_cache.url)  # a restarted worker: its index is empty, the stream is not
    assert len(later[0].semantic.store) >= 1
    assert ask(later, prompt=prompt, max_new_tokens=5)["text"] == computed["text"]
    assert own_cache.client().keys("sem:*") == [b"sem:generator:1.0:answers"]  # one stream per model and version


def test_planted_garbage_in_the_stream_is_skipped_and_counted(cached_generator_dir, own_cache, monkeypatch):
    monkeypatch.delenv(URL_ENV, raising=False)
    handler, context = load(cached_generator_dir, own_cache.url)
    recorder = record_metrics(context)
    stream = handler.semantic.shared.stream_key
    client = own_cache.client()
    client.xadd(stream, {b"e": b"\x80\x04pickle garbage"})
    client.xadd(stream, {b"other": b"field"})
    prompt = f"garbage {time.time_ns()}"
    run(handler, context, [{"prompt": prompt, "max_new_tokens": 3}])
    assert statuses(context, 1) == [200]
    assert sum(recorder.values("SharedCacheBadValues")) == 2


def test_a_dead_cache_server_costs_no_request_and_the_breaker_opens(
    cached_generator_dir, start_cache_server, monkeypatch
):
    monkeypatch.delenv(URL_ENV, raising=False)
    server = start_cache_server(name="semantic-dying-cache")
    handler, context = load(cached_generator_dir, server.url)
    prompt = f"dying {time.time_ns()}"
    run(handler, context, [{"prompt": prompt, "max_new_tokens": 3}])
    server.kill()
    for _ in range(5):
        answers = run(
            handler, context, [{"prompt": prompt, "max_new_tokens": 3}, {"prompt": "new", "max_new_tokens": 3}]
        )
        assert statuses(context, 2) == [200, 200]
        assert answers[0]["cached"]  # the worker's own index still answers
    assert handler.semantic.shared.breaker.times_opened >= 1


# ---------------------------------------------------------------------------------------------- the lexical check
# Pairs MiniLM embeds at 0.96 to 0.998 that ask different things: each must be refused, with a reason naming why.
NEAR_MISSES = {
    "word order": (
        "What time is it in Tokyo when it is noon in London?",
        "What time is it in London when it is noon in Tokyo?",
        "in' is followed",
    ),
    "converse": ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?", "'to'"),
    "converse accounts": (
        "How do I move money from savings to checking?",
        "How do I move money from checking to savings?",
        "'from'",
    ),
    "antonym": (
        "How long do I boil an egg for a hard-boiled egg?",
        "How long do I boil an egg for a soft-boiled egg?",
        "opposites",
    ),
    "particle antonym": ("How do I turn on dark mode?", "How do I turn off dark mode?", "opposites"),
    "check in / out": ("What time is check-in?", "What time is check-out?", "opposites"),
    "before / after": ("Can I return an item within 30 days?", "Can I return an item after 30 days?", "relation"),
    "how much vs how long": (
        "How much does shipping to Canada cost?",
        "How much does shipping to Canada take?",
        "asks for",
    ),
    "when vs where": ("When does the last train leave?", "Where does the last train leave?", "asks for"),
    "comparative": ("Is the train faster than flying?", "Is the train cheaper than flying?", "comparatives"),
    "than swapped": ("Is the train faster than the bus?", "Is the bus faster than the train?", "'than'"),
    "number": ("Which numbers between 1 and 10 are prime?", "Which numbers between 1 and 20 are prime?", "numbers"),
    "negation": (
        "Which numbers between 1 and 10 are prime?",
        "Which numbers between 1 and 10 are not prime?",
        "negations",
    ),
    "one word swapped": ("How do I sort a list in Python?", "How do I sort a list in JavaScript?", "one word"),
    "a name added": ("How many days are in a leap year?", "How many days are in February in a leap year?", "name"),
}
# Rewordings the check must let through: case, punctuation, contractions, hyphens, spellings, typos, fillers.
SAME_QUESTIONS = [
    ("How do I reset my password?", "how do i reset my pasword"),
    ("How do I cancel my subscription?", "how can i cancle my subscription please"),
    ("Where is my package?", "Where's my package??"),
    ("Which numbers between 1 and 10 are prime?", "What are the primes between one and ten?"),
    ("Can I deposit a cheque with the app?", "Can I deposit a check with the app?"),
    ("What time is it in Tokyo when it is noon in London?", "When it is midday in London, what's the time in Tokyo?"),
    ("How do I check-in online?", "How can I check in online?"),
    (
        "Do I get compensated if my flight is over 3 hours late?",
        "Is there compensation when my flight is more than three hours late?",
    ),
    ("When was Albert Einstein born?", "Einstein's birth year?"),
]


@pytest.mark.parametrize("shape", sorted(NEAR_MISSES))
def test_the_lexical_check_refuses_each_near_miss_shape_naming_why(shape):
    new, stored, says = NEAR_MISSES[shape]
    reasons = lexical.compare(lexical.read(new), lexical.read(stored))
    assert reasons and any(says in reason for reason in reasons), reasons
    assert lexical.compare(lexical.read(stored), lexical.read(new))  # in either direction


@pytest.mark.parametrize("new, stored", SAME_QUESTIONS)
def test_the_lexical_check_lets_rewordings_through(new, stored):
    assert lexical.compare(lexical.read(new), lexical.read(stored)) == []


@pytest.mark.parametrize(
    "text",
    ["", "?!.,", "\ud800 lone surrogate", "x" * 20_000, "1" * 5000, "one " * 2000, "'s n't 're", "\u2019s", "12 pm am"],
)
def test_the_lexical_check_reads_any_text(text):
    reading = lexical.read(text)
    assert isinstance(lexical.compare(reading, lexical.read("How do I reset my password?")), list)


# ----------------------------------------------------------------------------------------------------- candidates
def test_candidates_are_the_most_similar_of_the_group_above_the_threshold_best_first_with_their_prompts():
    store = SemanticStore(DIM, 100, 1 << 20, 60)
    query = unit(1)
    near = [query + scale * unit(seed) for seed, scale in ((2, 0.05), (3, 0.2), (4, 0.4), (5, 5.0))]
    for index, vector in enumerate(near):
        store.insert(b"g", vector / vector.norm(), answer(f"answer {index}"), prompt=f"prompt {index}")
    found = store.candidates(b"g", query, 0.8, 4)
    assert [c.prompt for c in found] == ["prompt 0", "prompt 1", "prompt 2"][: len(found)] and len(found) >= 2
    assert [c.hit.similarity for c in found] == sorted((c.hit.similarity for c in found), reverse=True)
    assert len(store.candidates(b"g", query, 0.8, 1)) == 1 and store.candidates(b"other", query, 0.1, 4) == []
    assert store.entry_bytes("answer", "prompt 0") == store.entry_bytes("answer") + len("prompt 0")


# ----------------------------------------------------------------------------------------------------- shared format
def test_a_shared_value_carries_the_prompt_and_an_earlier_formats_value_is_skipped_quietly():
    entry = SharedEntry(b"G" * 16, unit(5), StoredAnswer("answer", "stop", 4), time.time(), "the prompt ✓")
    value = encode_entry(entry, FINGERPRINT)
    assert decode(value).prompt == "the prompt ✓"
    older = value[:4] + b"\x01" + value[5:]
    assert decode(older) is None and SemanticTier.outdated(older, 0.0)
    assert not SemanticTier.outdated(b"pickle garbage", 0.0)


@pytest.mark.parametrize(
    "value, says",
    [
        ({"candidates": 0}, "candidates"),
        ({"candidates": 33}, "candidates"),
        ({"lexical_check": "yes"}, "lexical_check"),
        ({"verifier": "../x"}, "verifier"),
        ({"verifier_threshold": float("nan")}, "verifier_threshold"),
        ({"verifier_label": ""}, "verifier_label"),
        ({"verifier_handler": {"precison": "bf16"}}, "precison"),
    ],
)
def test_hostile_verification_settings_are_refused_naming_the_field(value, says):
    with pytest.raises(ConfigError, match=says):
        check(value)


def test_no_verifier_is_a_valid_setting():
    assert check({"verifier": ""})["verifier"] == ""


# ----------------------------------------------------------------------------------------------------- the verifier
@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory):
    """A tiny random cross-encoder, staged by the text-classifier prepare step as packaging stages a verifier."""
    from scripts import prepare_text_model
    from scripts.tiny_text_models import make_cross_encoder

    raw = make_cross_encoder(tmp_path_factory.mktemp("raw-verifier") / "cross-encoder")
    staged = tmp_path_factory.mktemp("verifier") / "verifier"
    command = ["--kind", "classification", "--source", str(raw), "--out", str(staged), "--backends", "none"]
    assert prepare_text_model.main(command) == 0
    return staged


def test_the_verifier_scores_pairs_through_the_text_engine_as_a_served_reranker_would(cross_encoder_dir):
    from sentence_transformers import CrossEncoder

    verifier = load_verifier(
        str(cross_encoder_dir.parent), "verifier", {"backend": "eager", "precision": "fp32"}, "auto", "t", "1", 1, None
    )
    pairs = [("How do I reset my password?", "how do i reset my pasword"), ("a", "b"), ("x" * 30_000, "too long")]
    scores = verifier.score(pairs * 30)  # more pairs than one request may carry: the engine scores each alone
    expected = CrossEncoder(str(cross_encoder_dir), device="cpu").predict(pairs[:2])
    assert scores[:2] == pytest.approx([float(e) for e in expected], abs=1e-5)
    assert scores[2] == 0.0 and len(scores) == 90  # a pair over the model's limits is not verified
    assert verifier.describe()["label"] == verifier.label


@pytest.mark.parametrize(
    "labels, wanted, chosen",
    [
        (["LABEL_0"], "auto", "LABEL_0"),
        (["not_duplicate", "duplicate"], "auto", "duplicate"),
        (["contradiction", "entailment", "neutral"], "auto", "entailment"),
        (["no", "yes"], "no", "no"),
    ],
)
def test_the_positive_label_is_found_or_named(labels, wanted, chosen):
    assert positive_label(labels, wanted) == chosen


def test_a_verifier_whose_positive_label_cannot_be_told_is_refused_naming_the_setting():
    with pytest.raises(ConfigError, match="verifier_label"):
        positive_label(["cat", "dog"], "auto")
    with pytest.raises(ConfigError, match="not one of"):
        positive_label(["cat", "dog"], "bird")


def test_a_verifier_that_refuses_every_candidate_keeps_the_cache_from_answering(
    cached_generator_dir, cross_encoder_dir, tmp_path
):
    folder = tmp_path / "model"
    shutil.copytree(cached_generator_dir, folder)
    shutil.copytree(cross_encoder_dir, folder / "verifier")
    handler, context = load(folder, verifier_threshold=2.0, verifier_handler={"backend": "eager"})
    recorder = record_metrics(context)
    prompt = f"verified {time.time_ns()}"
    run(handler, context, [{"prompt": prompt, "max_new_tokens": 3}])
    again = run(handler, context, [{"prompt": prompt, "max_new_tokens": 3}])[0]
    assert "cached" not in again  # the same prompt, refused by the verifier (no score reaches 2)
    assert sum(recorder.values("SemanticCacheRefused")) == 1
    assert handler.describe()["semantic_cache"]["verifier"]["label"] == "LABEL_0"
    passing, passing_context = load(folder, verifier_threshold=-1.0, verifier_handler={"backend": "eager"})
    run(passing, passing_context, [{"prompt": prompt, "max_new_tokens": 3}])
    assert "cached" in run(passing, passing_context, [{"prompt": prompt, "max_new_tokens": 3}])[0]


def retrained(folder, tmp_path, part):
    """A copy of ``folder`` whose ``part`` (lm/ or embedder/) has other weights, same architecture and width."""
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "retrained"
    shutil.copytree(folder, copy)
    weights = copy / part / "model.safetensors"
    tensors = load_file(str(weights))
    name = next(name for name, tensor in tensors.items() if tensor.is_floating_point())
    tensors[name] = tensors[name] + 0.01
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return copy


@pytest.mark.parametrize("part", ["lm", "embedder"])
def test_a_retrained_generator_or_embedder_under_the_same_name_never_gets_the_old_answers(
    cached_generator_dir, own_cache, monkeypatch, tmp_path, part
):
    """The similarity cache's groups hold the generator's identity (its content digest, handlers/core/identity.py),
    its shared values the embedder's: a worker of re-packaged weights reads the same stream but none of its answers."""
    monkeypatch.delenv(URL_ENV, raising=False)
    old = load(cached_generator_dir, own_cache.url)
    new = load(retrained(cached_generator_dir, tmp_path, part), own_cache.url)
    assert old[0].describe()["identity"] != new[0].describe()["identity"]
    embedders = [handler.describe()["semantic_cache"]["embedder"]["identity"] for handler, _ in (old, new)]
    assert (embedders[0] != embedders[1]) == (part == "embedder")
    prompt = f"retrained {part} {time.time_ns()}"
    ask(old, prompt=prompt, max_new_tokens=5)
    assert ask(load(cached_generator_dir, own_cache.url), prompt=prompt, max_new_tokens=5)["cached"]  # same content
    assert "cached" not in ask(new, prompt=prompt, max_new_tokens=5)
