"""The similarity cache's model-free check: do two prompts that embed alike ask the same thing?

A sentence embedding sees the topic and most of the words of a prompt; it barely registers the few words that decide
which answer is right. "Can I return an item within 30 days?" and "... after 30 days?" are 0.986 similar under
MiniLM; "convert Celsius to Fahrenheit" and "Fahrenheit to Celsius" 0.995; "hard-boiled" and "soft-boiled" 0.961. So a
stored prompt that the embedding proposes is served only when the two prompts also agree on each of these:

- **numbers** (digits and number words, "six" = "6") and **negations** (not, no, never, n't, without, ...);
- **relation words**: before / after / within / until / since / during, and per / daily / weekly / ...;
- **comparatives and superlatives**: more, less, higher, cheapest, most, at least, over, under, ...;
- **the question's target**: how much (money) / how long or how much ... take (time) / how many / when / where /
  why / who / how far / how old / how often / how do I (the steps);
- **roles**: which places, units or things come after from, to / into / for, than, in, on, between ... and in which
  order ("from Paris to Lyon" against "from Lyon to Paris", "noon in London -> Tokyo" against the reverse);
- **opposites**: a word in one prompt where the other has its opposite (increase / decrease, first / last, on / off,
  check in / check out, lock / unlock, ...);
- **one word swapped**: two prompts whose content words are the same but one, where those two words are not
  spellings of each other ("dog" / "cat", "Python" / "JavaScript", "window" / "aisle").

What is allowed to differ: case, punctuation, contractions ("what's", "can't"), hyphens ("check-in"), British and
American spellings, typos of one letter, filler words ("please", "just", "hi"), function words ("do" / "can", "my" /
"the"), and, where nothing above differs, any rewording the embedding accepts.

The check is conservative: where it cannot tell (a reordered sentence that keeps its meaning, "How much is it?" against
"What does it cost?"), it refuses, and a refusal only costs a decode. Each refusal says why (:func:`compare`), which is
what ``modelctl paraphrase`` prints. Reading a prompt takes tens of microseconds; a stored prompt is read once, when it
is stored.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

# ------------------------------------------------------------------------------------------------ vocabulary
CONTRACTIONS = {
    "can't": "can not",
    "cannot": "can not",
    "won't": "will not",
    "shan't": "shall not",
    "ain't": "is not",
    "let's": "let us",
    "what's": "what is",
    "where's": "where is",
    "when's": "when is",
    "who's": "who is",
    "how's": "how is",
    "why's": "why is",
    "that's": "that is",
    "there's": "there is",
    "it's": "it is",
    "here's": "here is",
}
SUFFIX_CONTRACTIONS = (("n't", " not"), ("'re", " are"), ("'ve", " have"), ("'ll", " will"), ("'d", " would"))
NEGATIONS = frozenset("not no never non without none nothing neither nor nobody nowhere".split())
NUMBER_WORDS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "thirteen": "13", "fourteen": "14",
    "fifteen": "15", "sixteen": "16", "seventeen": "17", "eighteen": "18", "nineteen": "19", "twenty": "20",
    "thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70", "eighty": "80", "ninety": "90",
    "hundred": "100", "thousand": "1000", "million": "1000000", "billion": "1000000000", "dozen": "12",
    "first": "1st", "second": "2nd", "third": "3rd", "fourth": "4th", "fifth": "5th", "sixth": "6th",
    "seventh": "7th", "eighth": "8th", "ninth": "9th", "tenth": "10th",
    "half": "half", "quarter": "quarter", "double": "double", "twice": "twice", "triple": "triple",
    "noon": "12:00", "midday": "12:00", "midnight": "0:00",
}  # fmt: skip
# Prepositions and conjunctions whose change changes the question (the same list as the docstring's).
RELATIONS = {
    "before": "before", "prior": "before", "ahead": "before", "earlier": "before",
    "after": "after", "later": "after", "following": "after", "past": "after", "once": "after",
    "within": "within", "inside": "within",
    "until": "until", "till": "until", "til": "until",
    "since": "since",
    "daily": "per day", "weekly": "per week", "monthly": "per month", "yearly": "per year",
    "annually": "per year", "annual": "per year", "hourly": "per hour", "nightly": "per night",
}  # fmt: skip
# Comparatives and superlatives: the word, and the dimension and direction it names (a change of either refuses).
DEGREES = {
    "more": "more", "most": "most", "less": "less", "least": "least", "fewer": "less", "fewest": "least",
    "higher": "high+", "highest": "high++", "lower": "high-", "lowest": "high--",
    "bigger": "big+", "biggest": "big++", "larger": "big+", "largest": "big++", "greater": "big+",
    "greatest": "big++", "smaller": "big-", "smallest": "big--", "maximum": "big++", "max": "big++",
    "minimum": "big--", "min": "big--",
    "cheaper": "price-", "cheapest": "price--", "pricier": "price+", "priciest": "price++",
    "faster": "speed+", "fastest": "speed++", "quicker": "speed+", "quickest": "speed++", "slower": "speed-",
    "slowest": "speed--",
    "longer": "long+", "longest": "long++", "shorter": "long-", "shortest": "long--",
    "older": "age+", "oldest": "age++", "younger": "age-", "youngest": "age--", "newer": "age-", "newest": "age--",
    "latest": "age--", "last": "age--",
    "better": "good+", "best": "good++", "worse": "good-", "worst": "good--",
    "busier": "busy+", "busiest": "busy++", "quieter": "busy-", "quietest": "busy--",
    "heavier": "weight+", "heaviest": "weight++", "lighter": "weight-", "lightest": "weight--",
    "hotter": "heat+", "hottest": "heat++", "warmer": "heat+", "warmest": "heat++", "colder": "heat-",
    "coldest": "heat--", "cooler": "heat-", "coolest": "heat--",
    "easier": "ease+", "easiest": "ease++", "harder": "ease-", "hardest": "ease--",
    "safer": "safe+", "safest": "safe++", "closer": "near+", "closest": "near++", "nearer": "near+",
    "nearest": "near++", "farther": "near-", "farthest": "near--", "further": "near-", "furthest": "near--",
    "stronger": "strong+", "strongest": "strong++", "weaker": "strong-", "weakest": "strong--",
    "richer": "rich+", "richest": "rich++", "poorer": "rich-", "poorest": "rich--",
}  # fmt: skip
# Words that name what a question asks for; "how much" is money unless the question is about time (take, time, long).
TIME_WORDS = frozenset("take takes took taking time long last lasts".split())
TIME_UNITS = frozenset("second seconds minute minutes min mins hour hours hr hrs day days week weeks month months year "
                       "years yr yrs night nights".split())  # fmt: skip
MONEY_WORDS = frozenset("cost costs price prices fee fees charge charges pay paid fare fares expensive cheap".split())
# Pairs of opposites: one prompt having one where the other has the other refuses. Particles (in / out, on / off,
# up / down) only count after a verb they turn around ("check in", "turn on").
OPPOSITES = [
    ("increase", "decrease"), ("increase", "reduce"), ("raise", "lower"), ("raise", "reduce"), ("add", "remove"),
    ("add", "delete"), ("open", "close"), ("open", "shut"), ("start", "stop"), ("start", "end"), ("begin", "end"),
    ("enable", "disable"), ("activate", "deactivate"), ("lock", "unlock"), ("block", "unblock"),
    ("freeze", "unfreeze"), ("install", "uninstall"), ("subscribe", "unsubscribe"), ("follow", "unfollow"),
    ("mute", "unmute"), ("pause", "resume"), ("show", "hide"), ("allow", "forbid"), ("allow", "block"),
    ("accept", "reject"), ("accept", "decline"), ("approve", "reject"), ("approve", "deny"), ("buy", "sell"),
    ("borrow", "lend"), ("send", "receive"), ("import", "export"), ("upload", "download"), ("upgrade", "downgrade"),
    ("deposit", "withdraw"), ("deposit", "withdrawal"), ("earn", "redeem"), ("earn", "spend"), ("save", "spend"),
    ("win", "lose"), ("find", "lose"), ("gain", "lose"), ("push", "pull"), ("encrypt", "decrypt"),
    ("compress", "decompress"), ("connect", "disconnect"), ("include", "exclude"), ("join", "leave"),
    ("arrive", "depart"), ("arrival", "departure"), ("inbound", "outbound"), ("incoming", "outgoing"),
    ("import", "export"), ("read", "write"), ("encode", "decode"), ("merge", "split"), ("zip", "unzip"),
    ("min", "max"), ("minimum", "maximum"), ("first", "last"), ("early", "late"), ("earlier", "later"),
    ("hard", "soft"), ("hot", "cold"), ("warm", "cool"), ("high", "low"), ("big", "small"), ("large", "small"),
    ("long", "short"), ("fast", "slow"), ("heavy", "light"), ("cheap", "expensive"), ("old", "new"),
    ("young", "old"), ("good", "bad"), ("safe", "unsafe"), ("legal", "illegal"), ("possible", "impossible"),
    ("able", "unable"), ("valid", "invalid"), ("true", "false"), ("yes", "no"), ("positive", "negative"),
    ("credit", "debit"), ("income", "expense"), ("profit", "loss"), ("asset", "liability"), ("buyer", "seller"),
    ("domestic", "international"), ("local", "foreign"), ("public", "private"), ("internal", "external"),
    ("upper", "lower"), ("uppercase", "lowercase"), ("top", "bottom"), ("left", "right"), ("front", "back"),
    ("north", "south"), ("east", "west"), ("inner", "outer"), ("input", "output"), ("before", "after"),
    ("ascending", "descending"), ("forward", "backward"), ("horizontal", "vertical"), ("day", "night"),
    ("morning", "evening"), ("summer", "winter"), ("spring", "autumn"), ("spring", "fall"), ("male", "female"),
    ("boil", "freeze"), ("boiling", "freezing"), ("wet", "dry"), ("full", "empty"), ("more", "less"),
    ("aisle", "window"), ("window", "middle"), ("pick", "drop"), ("checked", "carry"), ("economy", "business"),
    ("arrive", "leave"), ("come", "go"), ("entry", "exit"), ("enter", "exit"), ("login", "logout"),
]  # fmt: skip
PARTICLES = {"in": "out", "out": "in", "on": "off", "off": "on", "up": "down", "down": "up"}
PARTICLE_VERBS = frozenset(
    "check checked checking checks turn turned turning turns switch switched switching log logged logging logs sign "
    "signed signing signs opt opted opting scale scaled scaling zoom zooming zoomed clock clocked power powered "
    "powering speed slow cool warm move moved moving".split()
)
# Function words and fillers: no content of their own for the "one word swapped" test.
STOPWORDS = frozenset(
    """a an the this that these those my your our their his her its me i you we they he she it us them myself
    is are was were be been being am do does did doing done have has had having can could will would shall should
    may might must need needs to of in on at for from by with about into onto over under as and or but if so then
    than too very just really actually kindly please hi hello hey thanks thank there here what which who whom whose
    when where why how whats also any some all each every get got getting go going want wanted like would let tell
    give show explain know find way ways thing things use using used name describe it's im i'm ok okay now one ones
    still yet again else
    between versus vs via per up out off down through across around along against among upon""".split()
)
DETERMINERS = frozenset("a an the this that these those my your our their his her its some any each every".split())
ANCHORED_ROLES = frozenset({"in", "on"})
ROLE_WORDS = {
    "from": "from", "to": "to", "into": "to", "towards": "to", "toward": "to", "for": "to", "than": "than",
    "in": "in", "at": "in", "on": "on", "by": "by", "with": "with", "of": "of",
}  # fmt: skip
# British / American spellings and other variants: mapped before anything else.
SPELLINGS = {
    "cheque": "check", "cheques": "checks", "colour": "color", "colours": "colors", "favourite": "favorite",
    "centre": "center", "metre": "meter", "metres": "meters", "litre": "liter", "litres": "liters",
    "travelling": "traveling", "travelled": "traveled", "cancelling": "canceling", "cancelled": "canceled",
    "cancellation": "cancelation", "programme": "program", "licence": "license", "organise": "organize",
    "catalogue": "catalog", "grey": "gray", "jewellery": "jewelry", "aeroplane": "airplane", "plane": "airplane",
    "tyre": "tire", "tyres": "tires", "enrol": "enroll", "behaviour": "behavior", "labour": "labor",
    "email": "email", "e-mail": "email", "checkin": "check in", "checkout": "check out", "login": "log in",
    "logout": "log out", "signin": "sign in", "signup": "sign up", "setup": "set up", "pickup": "pick up",
    "dropoff": "drop off", "carryon": "carry on", "ok": "okay", "pls": "please", "plz": "please", "u": "you",
    "ur": "your", "r": "are", "yr": "year", "yrs": "years", "hr": "hour", "hrs": "hours", "mins": "minutes",
    "min": "minutes", "secs": "seconds", "sec": "seconds", "nyc": "new york", "ny": "new york",
    "jan": "january", "feb": "february", "mar": "march", "apr": "april", "jun": "june", "jul": "july",
    "aug": "august", "sep": "september", "sept": "september", "oct": "october", "nov": "november",
    "dec": "december", "js": "javascript", "auth": "authentication", "info": "information", "pic": "picture",
    "pics": "pictures", "pw": "password", "pwd": "password", "acct": "account", "msg": "message",
    "approx": "approximately", "appt": "appointment", "tv": "television", "pc": "computer",
}  # fmt: skip
WORD = re.compile(r"\d+(?:[.,:]\d+)*(?:st|nd|rd|th|am|pm|%)?|[a-z]+(?:'[a-z]+)?|[.,;:?!]")
CLAUSE_ENDS = frozenset(".,;:?!")
BOUNDARY = "|"  # a clause boundary (punctuation) in a normalised word list
NAME = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?|[.?!]")
ONE_BEFORE = ("and", "or", "to", "of", "more", "at", "in", "per")  # "between one and ten", "one of", "one at a time"
# A comparative followed by one of these is an idiom, not a comparison: "the best way to", "the easiest way".
IDIOM_NOUNS = frozenset("way ways option options method methods practice approach".split())
# Bounds that compare only before a number: "over 3 hours", "under 18" (but "loop over", "under my account").
BOUNDS = {"over": "more", "above": "more", "exceeding": "more", "beyond": "more", "under": "less", "below": "less"}
WH_TARGETS = {"when": "moment", "where": "place", "why": "reason", "who": "person", "whom": "person", "whose": "person"}
CLAUSE_OPENERS = frozenset({BOUNDARY, "if", "and", "so", "but", "know", "me", "tell", "ask"})
STEP_VERBS = frozenset("do can could should would to does did will may".split())
HOW_TARGETS = {"long": "time span", "far": "distance", "old": "age", "often": "frequency", "soon": "moment"}
# Words the "one word swapped" test takes as the same word (the check stays strict where two words differ).
SYNONYMS = [
    "change switch set update modify edit alter",
    "delete remove erase",
    "cancel terminate",
    "start begin launch",
    "get obtain receive acquire",
    "make create",
    "see view display",
    "fix repair solve resolve",
    "buy purchase",
    "write author writer",
    "pick choose select",
    "help assist",
    "need require",
    "big large",
    "small little",
    "fast quick rapid",
    "price cost fee charge",
    "money cash fund",
    "transfer move wire",
    "allow permit",
    "enable activate",
    "disable deactivate",
    "account profile",
    "phone telephone",
    "error issue problem",
    "picture photo image",
    "car vehicle auto",
    "bag luggage baggage suitcase",
    "flight plane airplane",
    "bike bicycle",
    "ticket fare",
    "hotel lodging",
    "shop store",
    "purchase order",
]
IRREGULAR = {
    "wrote": "write", "written": "write", "ate": "eat", "eaten": "eat", "took": "take", "taken": "take",
    "made": "make", "bought": "buy", "sent": "send", "paid": "pay", "lost": "lose", "found": "find",
    "got": "get", "gotten": "get", "gave": "give", "given": "give", "went": "go", "gone": "go", "did": "do",
    "done": "do", "began": "begin", "begun": "begin", "chose": "choose", "chosen": "choose", "forgot": "forget",
    "forgotten": "forget", "spent": "spend", "sold": "sell", "held": "hold", "kept": "keep", "met": "meet",
    "ran": "run", "saw": "see", "seen": "see", "told": "tell", "thought": "think", "drove": "drive",
    "driven": "drive", "flew": "fly", "flown": "fly", "broke": "break", "broken": "break", "froze": "freeze",
    "frozen": "freeze", "stole": "steal", "stolen": "steal", "withdrew": "withdraw", "withdrawn": "withdraw",
    "children": "child", "people": "person", "men": "man", "women": "woman", "feet": "foot", "teeth": "tooth",
}  # fmt: skip


def opposite_index() -> dict[str, set[str]]:
    index: dict[str, set[str]] = {}
    for first, second in OPPOSITES:
        index.setdefault(stem(first), set()).add(stem(second))
        index.setdefault(stem(second), set()).add(stem(first))
    return index


def stem(word: str) -> str:
    """A crude stem, enough to see 'cancel' / 'canceling' / 'cancels' and 'check' / 'checked' as one word."""
    if word in IRREGULAR:
        return IRREGULAR[word]
    if word.isdigit() or len(word) <= 3:
        return word
    if word.endswith("ence") and len(word) >= 8:
        return word[:-4]  # difference -> differ
    for suffix in ("ing", "ed", "es", "s", "ly"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith(("us", "ss", "is")):
            base = word[: -len(suffix)]
            if suffix in ("ing", "ed") and len(base) >= 3 and base[-1] == base[-2] and base[-1] not in "ls":
                base = base[:-1]  # stopped -> stop, but not call -> cal
            if suffix == "es" and not base.endswith(("s", "x", "z", "ch", "sh")):
                base = word[:-1]  # fees -> fee, prices -> price
            return base.rstrip("e") or base
    return word.rstrip("e") if len(word) > 4 else word


OPPOSITE_STEMS = opposite_index()
SYNONYM_OF = {stem(word): line.split()[0] for line in SYNONYMS for word in line.split()}


# ------------------------------------------------------------------------------------------------ reading
@dataclass(frozen=True)
class Reading:
    """What one prompt says that an answer depends on (see the module docstring); :func:`read` makes one."""

    text: str
    words: tuple[str, ...]  # normalised words, in order
    numbers: tuple[str, ...]
    negations: int
    relations: frozenset[str]
    degrees: tuple[str, ...]
    targets: frozenset[str]
    roles: tuple[tuple[str, str], ...]  # (role, stem of a content word after it), in order
    particles: tuple[str, ...]  # "check in", "turn off": verb stem + particle
    content: tuple[str, ...]  # stems of the content words, in order
    stems: frozenset[str]  # stems of every word
    names: tuple[tuple[str, ...], ...]  # capitalised words inside a sentence: places, people, products


def normalise(text: str) -> list[str]:
    """Lower-case words with contractions, hyphens and spelling variants undone; punctuation that ends a clause is a
    BOUNDARY."""
    text = text.casefold().replace("\u2019", "'").replace("\u2018", "'")
    text = re.sub(r"(?<=[a-z])-(?=[a-z])", " ", text)  # check-in -> check in, hard-boiled -> hard boiled
    text = re.sub(r"(?<=\d)-(?=[a-z])", " ", text)  # 45-minute -> 45 minute
    words: list[str] = []
    for match in WORD.finditer(text):
        word = match.group()
        if word in CLAUSE_ENDS:
            words.append(BOUNDARY)
        elif word in CONTRACTIONS:
            words += CONTRACTIONS[word].split()
        elif word.endswith("'s"):
            words.append(word[:-2])  # a possessive ("is" of the common wh-words is handled above)
        elif word in SPELLINGS:
            words += SPELLINGS[word].split()
        else:
            for suffix, replacement in SUFFIX_CONTRACTIONS:
                if word.endswith(suffix):
                    base = word[: -len(suffix)]
                    if suffix == "n't":
                        base = {"ca": "can", "wo": "will", "sha": "shall"}.get(base, base)
                    words += [base, *replacement.split()] if base else replacement.split()
                    break
            else:
                words.append(word)
    return words


def number_of(words: list[str], position: int) -> str | None:
    """The number a word stands for (digits normalised, "6" = "six", "12 pm" = "noon"), or None. "one" as a pronoun
    ("how do I get one?", "a new one") and "second" as a noun are not numbers."""
    word = words[position]
    before = words[position - 1] if position else ""
    after = words[position + 1] if position + 1 < len(words) else ""
    if word[0].isdigit():
        value = word.replace(",", "").rstrip("%")
        unit = value[-2:] if value.endswith(("am", "pm")) else after if after in ("am", "pm") else ""
        if unit:
            hour = value.removesuffix(unit).split(":")[0]
            return f"{int(hour) % 12 + (12 if unit == 'pm' else 0)}:00" if hour.isdigit() else value
        return value
    if word == "one":
        pronoun_before = before in DETERMINERS or before in ("new", "another", "which", "no", "any", "every")
        if pronoun_before or after in ("", BOUNDARY) or (after in STOPWORDS and after not in ONE_BEFORE):
            return None
    if word == "second" and (after in ("", BOUNDARY) or after in STOPWORDS):
        return None  # "wait a second"
    return NUMBER_WORDS.get(word)


def read(text: str) -> Reading:
    words = normalise(text)
    positions = [position for position, word in enumerate(words) if word != BOUNDARY]
    numbers = {position: number_of(words, position) for position in positions}
    return Reading(
        text,
        tuple(words),
        tuple(number for number in numbers.values() if number is not None),
        sum(words[position] in NEGATIONS for position in positions),
        frozenset(relation for position in positions for relation in relations_at(words, position)),
        tuple(sorted(degree for position in positions for degree in degrees_at(words, position))),
        frozenset(question_targets(words)),
        tuple(role for position in positions for role in roles_at(words, position)),
        tuple(
            f"{stem(words[position - 1])} {words[position]}"
            for position in positions
            if words[position] in PARTICLES and position and words[position - 1] in PARTICLE_VERBS
        ),
        tuple(
            stem(words[position])
            for position in positions
            if numbers[position] is None and not skipped(words[position])
        ),
        frozenset(stem(words[position]) for position in positions),
        names(text),
    )


def skipped(word: str) -> bool:
    """Not a content word: a function or filler word, a negation or a relation word (each compared on its own)."""
    return word in STOPWORDS or word in NEGATIONS or word in RELATIONS


def following_word(words: list[str], position: int) -> str:
    return words[position + 1] if position + 1 < len(words) else ""


def relations_at(words: list[str], position: int) -> list[str]:
    word, following = words[position], following_word(words, position)
    if word == "per" and following not in ("", BOUNDARY):
        return [f"per {stem(following)}"]
    if word not in RELATIONS or (word == "once" and position == 0) or (word == "ahead" and following != "of"):
        return []
    return [RELATIONS[word]]


def degrees_at(words: list[str], position: int) -> list[str]:
    word, following = words[position], following_word(words, position)
    before = words[position - 1] if position else ""
    if word == "at" and following in ("least", "most"):
        return [f"at {following}"]
    if word == "most" and following == "recent":
        return [DEGREES["latest"]]  # "most recent" is one degree
    if word == "recent" and before == "most":
        return []
    if word in DEGREES and following not in IDIOM_NOUNS:
        return [DEGREES[word]]
    if word in BOUNDS and following and following != BOUNDARY and number_of(words, position + 1) is not None:
        return [BOUNDS[word]]
    return []


def roles_at(words: list[str], position: int) -> list[tuple[str, str]]:
    word = words[position]
    if word not in ROLE_WORDS:
        return []
    role = ROLE_WORDS[word]
    if role in ANCHORED_ROLES:  # "noon in London" and "time in Tokyo" are two roles, not one
        role = f"{anchor(words, position)} {role}"
    return [(role, filler) for filler in role_fillers(words, position + 1)]


def names(text: str) -> tuple[tuple[str, ...], ...]:
    """Runs of capitalised words that do not start a sentence ("Tokyo", "Albert Einstein", "SQL"), as stems: a name
    one prompt has must be in the other one too (a prompt typed all in lower case has none of its own)."""
    found: list[tuple[str, ...]] = []
    run: list[str] = []
    sentence_start = True
    for match in NAME.finditer(text.replace("\u2019", "'")):
        token = match.group()
        word = token.split("'")[0]
        if token[0].isalpha() and not sentence_start and word[0].isupper() and word.casefold() not in STOPWORDS:
            run += [stem(part) for part in SPELLINGS.get(word.casefold(), word.casefold()).split()]
        else:
            if run:
                found.append(tuple(run))
            run = []
        sentence_start = token in ".?!"
    if run:
        found.append(tuple(run))
    return tuple(found)


def has_name(name: tuple[str, ...], reading: Reading) -> bool:
    """A name is there when one of its words is ("Einstein" for "Albert Einstein"), or a word it starts
    ("pythonic" for "Python")."""
    return any(
        part in reading.stems or any(len(part) >= 4 and word.startswith(part) for word in reading.stems)
        for part in name
    )


def anchor(words: list[str], position: int) -> str:
    """The content word (or number) a locative phrase hangs on: "noon" in "noon in London", "time" in "what time is
    it in Tokyo"; '' at the start of a clause."""
    for index in range(position - 1, -1, -1):
        word = words[index]
        if word == BOUNDARY:
            return ""
        number = number_of(words, index)
        if number is not None:
            return number
        if word not in STOPWORDS and word not in NEGATIONS:
            return stem(word)
    return ""


def role_fillers(words: list[str], start: int) -> list[str]:
    """The content words (up to two) after a role word, skipping determiners: "to my checking account" -> checking,
    account."""
    fillers: list[str] = []
    position = start
    while position < len(words) and words[position] in DETERMINERS:
        position += 1
    while position < len(words) and len(fillers) < 2:
        word = words[position]
        if word == BOUNDARY or word in STOPWORDS or word in NEGATIONS:
            break
        fillers.append(stem(word))
        position += 1
    return fillers


def question_targets(words: list[str]) -> set[str]:
    """What the question asks for: money, time span, count, moment, place, reason, person, distance, age, frequency,
    steps. Empty for a yes/no question, an imperative or a plain "what". "when", "where", "who" and "why" count at
    the start or the end of a clause only (elsewhere they join clauses: "... when my computer starts")."""
    targets = set()
    for position, word in enumerate(words):
        before = words[position - 1] if position else BOUNDARY
        following = following_word(words, position)
        clause_edge = before in CLAUSE_OPENERS or following in ("", BOUNDARY)  # "hamlet was written by whom?"
        if word == "how":
            targets.update(how_target(words, position))
        elif clause_edge and word in WH_TARGETS:
            targets.add(WH_TARGETS[word])
        elif clause_edge and word in ("what", "which") and following in ("time", "day", "date", "year", "hour"):
            targets.add("moment")
    if not targets and words and words[0] == "what" and any(w in MONEY_WORDS for w in words):
        targets.add("money")  # "what does it cost", "what is the fee"
    return targets


def how_target(words: list[str], position: int) -> list[str]:
    """What "how ..." asks for: "how much" is money unless the question is about time ("how much does it take")."""
    following = following_word(words, position)
    if following == "much":
        after = words[position + 2 : position + 8]
        about_time = any(
            (w in TIME_WORDS or w in TIME_UNITS) and (i + 1 == len(after) or after[i + 1] not in PARTICLES)
            for i, w in enumerate(after)
        )
        about_money = any(w in MONEY_WORDS for w in words)
        return ["time span" if about_time and not about_money else "money"]
    if following == "many":
        unit = words[position + 2] if position + 2 < len(words) else ""
        return ["time span" if unit in TIME_UNITS else "count"]
    if following == "come":
        return ["reason"]
    if following in HOW_TARGETS:
        return [HOW_TARGETS[following]]
    if following in STEP_VERBS:
        return ["steps"]
    return []


# ------------------------------------------------------------------------------------------------ comparing
def compare(new: Reading, stored: Reading) -> list[str]:
    """Why ``stored``'s answer would not answer ``new`` (empty: nothing this check can see differs)."""
    reasons = []
    if new.numbers != stored.numbers:
        reasons.append(f"numbers differ: {shown(new.numbers)} / {shown(stored.numbers)}")
    if new.negations != stored.negations:
        reasons.append(f"negations differ: {new.negations} / {stored.negations}")
    if new.relations != stored.relations:
        reasons.append(f"relation words differ: {shown(new.relations)} / {shown(stored.relations)}")
    if new.degrees != stored.degrees:
        reasons.append(f"comparatives differ: {shown(new.degrees)} / {shown(stored.degrees)}")
    if new.targets and stored.targets and asked(new.targets) != asked(stored.targets):
        reasons.append(f"asks for another thing: {shown(new.targets)} / {shown(stored.targets)}")
    missing = [name for name in new.names if not has_name(name, stored)]
    missing += [name for name in stored.names if not has_name(name, new)]
    if missing:
        reasons.append(f"a name only one of them has: {', '.join(' '.join(name) for name in missing)}")
    reasons += role_conflicts(new, stored)
    reasons += opposite_conflicts(new, stored)
    swapped = one_word_swapped(new, stored)
    if swapped and not any(reason.startswith("opposite") for reason in reasons):
        reasons.append(f"one word differs: '{swapped[0]}' / '{swapped[1]}'")
    return reasons


def asked(targets: frozenset[str]) -> frozenset[str]:
    """Targets as compared: "where do I set up X" asks for the steps as much as "how do I set up X"."""
    return frozenset("steps" if target == "place" else target for target in targets)


def shown(values: tuple[str, ...] | frozenset[str]) -> str:
    items = sorted(values) if isinstance(values, frozenset) else list(values)
    return ", ".join(items) if items else "none"


def role_conflicts(new: Reading, stored: Reading) -> list[str]:
    """Words both prompts have, in different roles or another order ("from A to B" / "from B to A")."""
    shared = set(new.stems) & set(stored.stems)
    named = {part for name in new.names + stored.names for part in name}
    reasons = []
    for role in sorted({role for role, _ in new.roles} & {role for role, _ in stored.roles}):
        # A place of an anchored role ("noon in X") must be the same place; a directional one ("from X", "to X") must
        # not be a word the other prompt has elsewhere (A and B swapped).
        kept = shared | named if " " in role else shared
        mine = [word for r, word in new.roles if r == role and word in kept]
        theirs = [word for r, word in stored.roles if r == role and word in kept]
        common = [word for word in unique(mine) if word in theirs]
        if mine and theirs and (not common or common != [word for word in unique(theirs) if word in mine]):
            reasons.append(f"'{role}' is followed by {', '.join(unique(mine))} / {', '.join(unique(theirs))}")
    return reasons


def unique(words: list[str]) -> list[str]:
    return list(dict.fromkeys(words))


def opposite_conflicts(new: Reading, stored: Reading) -> list[str]:
    """A word in one prompt where the other has its opposite (counted, so "turn off dark mode on my phone" against
    "turn on dark mode on my phone" is seen although both have an "on")."""
    mine, theirs = Counter(stem(w) for w in new.words), Counter(stem(w) for w in stored.words)
    reasons = []
    for word, more in (mine - theirs).items():
        for opposite in OPPOSITE_STEMS.get(word, ()):
            if (theirs - mine).get(opposite, 0) and more:
                reasons.append(f"opposites: '{word}' / '{opposite}'")
    mine_particles, their_particles = Counter(new.particles), Counter(stored.particles)
    for phrase in mine_particles - their_particles:
        verb, particle = phrase.split()
        if f"{verb} {PARTICLES[particle]}" in their_particles - mine_particles:
            reasons.append(f"opposites: '{phrase}' / '{verb} {PARTICLES[particle]}'")
    return sorted(set(reasons))


def one_word_swapped(new: Reading, stored: Reading) -> tuple[str, str] | None:
    """The two words, when the prompts' content words are the same but one each, and those are not spellings of one
    word ("reset" / "reset", "password" / "pasword" are)."""
    mine, theirs = Counter(new.content), Counter(stored.content)
    only_mine, only_theirs = list((mine - theirs).elements()), list((theirs - mine).elements())
    if len(only_mine) != 1 or len(only_theirs) != 1 or len(mine) < 2:
        return None
    first, second = only_mine[0], only_theirs[0]
    if spelled_alike(first, second) or SYNONYM_OF.get(first, first) == SYNONYM_OF.get(second, second):
        return None
    return first, second


def spelled_alike(first: str, second: str) -> bool:
    """One typo apart (a letter added, dropped, changed or two swapped), for words of four letters or more."""
    if min(len(first), len(second)) < 4 or abs(len(first) - len(second)) > 1:
        return False
    if len(first) == len(second):
        diffs = [i for i in range(len(first)) if first[i] != second[i]]
        if len(diffs) == 1:
            return True
        return (
            len(diffs) == 2
            and diffs[1] == diffs[0] + 1
            and first[diffs[0]] == second[diffs[1]]
            and (first[diffs[1]] == second[diffs[0]])
        )
    longer, shorter = (first, second) if len(first) > len(second) else (second, first)
    return any(longer[:i] + longer[i + 1 :] == shorter for i in range(len(longer)))
