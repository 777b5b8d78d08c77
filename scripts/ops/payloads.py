"""The one random-text generator: seeded word sequences from a vocabulary, for load tests, references, the fuzzer,
the cost check and the benchmarks.

Callers pick the vocabulary: WORDS (common English, about one WordPiece token each), ONE_TOKEN_WORDS (words MiniLM's
tokenizer keeps whole, so a text's token count is its word count) or WORDS + UNICODE_WORDS (tokenizer edge
cases: accents, CJK, emoji).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

# A small vocabulary of common English words: realistic token counts without shipping a corpus.
WORDS = tuple(
    """
the of and to in is that for it as was with be by on not he this are or his from at which but have an they
you were her she there one all we their has been if more when will would who so no time people year way day
man thing woman life child world school state family student group country problem hand part place case week
company system program question work government number night point home water room mother area money story
fact month lot right study book eye job word business issue side kind head house service friend father power
hour game line end member law car city community name president team minute idea kid body information back
parent face others level office door health person art war history party result change morning reason research
girl guy moment air teacher force education foot boy age policy process music market sense nation plan college
interest death experience effect use class control care field development role effort rate heart drug show
leader light voice wife police mind price report decision son view relationship town road arm difference value
building action model season society tax director position player record paper space ground form event official
matter center couple site project activity star table need court oil situation cost industry figure street
image phone data picture practice piece land product doctor wall patient worker news test movie north love
support technology step baby computer type attention film tree source organization hair window evidence
population truth song energy network machine learning serving latency throughput request batch queue model
""".split()
)

# Words the MiniLM tokenizer keeps whole (one token each), so a text's token count is its word count.
ONE_TOKEN_WORDS = tuple(
    """
house water river stone cloud green music light paper table chair north south city road tree bird fish door window
garden yellow quiet bright winter summer forest market letter doctor planet circle silver ocean story little people
travel history morning coffee mountain engine
""".split()
)

# Words that exercise a tokenizer's unusual paths: accents, CJK, emoji.
UNICODE_WORDS = ("café", "naïve", "東京", "🙂")


def words(rng: random.Random, count: int, vocabulary: Sequence[str] = WORDS) -> str:
    """`count` words drawn from the vocabulary, separated by single spaces."""
    return " ".join(rng.choice(vocabulary) for _ in range(count))


def sentence(rng: random.Random, count: int, vocabulary: Sequence[str] = WORDS) -> str:
    """`count` words as a sentence: capitalised, ending with a full stop."""
    text = words(rng, count, vocabulary)
    return text[0].upper() + text[1:] + "."


# The README mix of text lengths: (share of requests, fewest words, most words). Common English words are about one
# WordPiece token each, so the last band (257-400 words of WORDS) exceeds MiniLM's 256-token window. The load tests
# send it (loadtests/payloads.py) and the backend build weighs its ranking by it (scripts/build_backends.py).
MINILM_LENGTH_MIX = (
    (0.60, 3, 16),  # queries, titles, short sentences
    (0.25, 17, 64),  # sentences and short paragraphs
    (0.10, 65, 200),  # paragraphs
    (0.05, 257, 400),  # documents longer than the model's window
)
MINILM_REPEAT_SHARE = 0.2  # share of requests drawn from the popular set
MINILM_REPEAT_HEAVY_SHARE = 0.8  # the repeat-heavy mix (traffic "minilm-repeats")
MINILM_POPULAR_COUNT = 50  # size of the popular set; picked with Zipf-like weights (a few sentences dominate)


def mix_words(rng: random.Random) -> int:
    """A sentence length, in words, drawn from MINILM_LENGTH_MIX."""
    pick = rng.random()
    for share, low, high in MINILM_LENGTH_MIX:
        if pick < share:
            return rng.randint(low, high)
        pick -= share
    return rng.randint(MINILM_LENGTH_MIX[-1][1], MINILM_LENGTH_MIX[-1][2])


class ReadmeTextMix:
    """Seeded stream of README-mix texts; the popular set depends only on the base seed (shared by load-test users)."""

    repeat_share = MINILM_REPEAT_SHARE

    def __init__(self, seed: int = 0, stream: int = 0) -> None:
        popular_rng = random.Random(f"minilm-popular-{seed}")
        self.popular = [sentence(popular_rng, mix_words(popular_rng)) for _ in range(MINILM_POPULAR_COUNT)]
        self.popular_weights = [1.0 / (rank + 1) for rank in range(MINILM_POPULAR_COUNT)]
        self.rng = random.Random(f"minilm-{seed}-{stream}")

    def next_text(self) -> str:
        if self.rng.random() < self.repeat_share:
            return self.rng.choices(self.popular, weights=self.popular_weights)[0]
        return sentence(self.rng, mix_words(self.rng))
