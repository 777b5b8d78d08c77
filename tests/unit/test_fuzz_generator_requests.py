"""Property-based fuzzing of the generator's request parsing: no body makes it raise anything but RequestError, and
whatever it accepts is within the configured limits."""

from hypothesis import given, settings
from hypothesis import strategies as st

from handlers.core.errors import RequestError
from handlers.generation.native import FIELDS, parse_generation_request
from handlers.generation.requests import MAX_SEED, GenerationLimits

LIMITS = GenerationLimits(
    max_prompt_tokens=16,
    max_new_tokens=64,
    default_max_new_tokens=8,
    max_temperature=5.0,
    vocab_size=512,
    max_prompt_chars=17 * 16,
    max_n=4,
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats()
    | st.text(max_size=40)
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
near_valid = st.dictionaries(st.sampled_from(FIELDS + ("extra",)), json_values, max_size=6) | st.fixed_dictionaries(
    {"prompt": st.text(max_size=300)},
    optional={
        "max_new_tokens": st.integers(-5, 100) | json_scalars,
        "temperature": st.floats() | json_scalars,
        "top_k": st.integers(-3, 600) | json_scalars,
        "seed": st.integers(-3, 2**65) | json_scalars,
        "stream": json_scalars,
        "logprobs": st.integers(-2, 22) | json_scalars,
        "n": st.integers(-1, 6) | json_scalars,
    },
)


def byte_tokens(prompt):
    """Stand-in tokenizer: one token per UTF-8 byte (as a byte-level BPE without merges)."""
    return list(prompt.encode("utf-8"))


@settings(max_examples=400, deadline=None)
@given(body=json_values | near_valid)
def test_any_body_is_accepted_within_limits_or_refused_with_a_request_error(body):
    try:
        request = parse_generation_request(body, LIMITS, byte_tokens)
    except RequestError as error:
        assert error.code == 400 and error.message
        return
    settings_ = request.settings
    assert 1 <= len(request.prompt_ids) <= LIMITS.max_prompt_tokens
    assert 1 <= settings_.max_new_tokens <= LIMITS.max_new_tokens
    assert 0 <= settings_.temperature <= LIMITS.max_temperature
    assert 0 <= settings_.top_k <= LIMITS.vocab_size and 0 <= settings_.seed <= MAX_SEED
    assert isinstance(request.stream, bool)
    assert settings_.logprobs is None or 0 <= settings_.logprobs <= 20
    assert 1 <= request.n <= LIMITS.max_n
