"""Small random-weight text models, built offline in seconds, for the tests and tools that package a user's own model
folder (the tests, loadtests/architectures.py, loadtests/semantic_cache_report.py).

The packaging feature accepts a folder the user brings: a sentence-transformers embedding model, a Hugging Face text
classifier or a cross-encoder reranker. Tests cannot download real ones (no hub here) and real ones are slow on 2
cores, so this module writes folders with the same files and layout as the real thing, only tiny (32 wide, 2 layers,
a few hundred KB) with seeded random weights and a tokenizer whose vocabulary comes from an in-code word list. Nothing
in a test should expect meaningful embeddings or labels from them: the expected numbers come from the reference
libraries (sentence-transformers, transformers) loading the same folder inside the test, and the test compares the
served answers with those.

Every builder takes the target folder, writes into it (creating it) and returns it, in well under a second; nothing
is random between runs, so the same call writes byte-identical files. `to_legacy_layout` rewrites a
sentence-transformers folder the way versions before 6 saved it (most hub models); the `break_*` functions turn a
good folder into one that packaging must refuse.
"""

import json
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SEED = 0
HIDDEN = 32
LAYERS = 2
HEADS = 4
INTERMEDIATE = 64
# Real BERTs have more positions than the max_seq_length their sentence-transformers config uses; keep that shape.
BERT_POSITIONS = 128
CLASSIFIER_MAX_LENGTH = 128
NLI_LABELS = ("entailment", "neutral", "contradiction")
# transformers' default std of 0.02 leaves a 32-wide 2-layer encoder all but blind to its input: CLS embeddings of
# different texts have cosine 1.000 and classifier logits agree to 1e-3, so a test could not tell whose answer it got.
# With 0.5, different texts get clearly different embeddings (cosines ~0.7-0.9) and different top labels.
INITIALIZER_RANGE = 0.5

_ENGLISH = """
a about above account accounts across add address after again against agent all allow also always am an and another
answer any app apply are area around as ask at available away back bad bank be because been before begin being below
best better between big bill billing book both box bring broken browser but buy by call can cancel cannot card care
case change charge charged chat check city class clear click close code cold come company computer contact cost
could country credit customer data date day days delete delivery device did different do document does done door
down download during each early easy email enough error even every example fast fee feel few file find fine first
fix for form found free from full get give go good got great group had hand happy hard has have he help her here
high him his home hot hour house how however i if important in information into is issue it its just keep key kind
know language large last late learn leave left less let life like line link list little live log login long look
lost love low made mail make man many may me message might mind minute minutes money month more morning most move
much must my name need network never new next night no not nothing now number of off offer often old on once one
online only open or order other our out over page paid part passage password pay payment people person phone place
plan play please point policy possible price problem product program query question quick quickly rate read ready
really reason receive refund register remember remove reply report request reset return right room run said same
save say screen search second see send sent service set setting settings share she ship shipping should show sign
since site slow small so some something soon start still stop store support sure system take team tell test than
thank thanks that the their them then there these they thing think this those though through time to today together
too top total try turn two under until up update upgrade us use used user username very view wait want was water way
we week well went were what when where which while who why will window with without word work working world would
write wrong year yes yet you your
"""

# Accented and non-Latin words: the BERT tokenizer lowercases and strips accents, the XLM-R one keeps them, so both
# paths (normalised and raw Unicode) get exercised by the same test texts.
_MULTILINGUAL = """
le la les un une des est et très chaud froid café thé bonjour merci où à déjà élève garçon français naïve résumé
façade crème brûlée hôtel voilà el los las es muy niño año señor mañana gracias hola adiós español qué cómo der die
das ist und nicht über straße grün schön müde danke bitte zürich o a é não coração são obrigado ação você привет мир
спасибо да нет καλημέρα ευχαριστώ 你好 世界 谢谢 こんにちは ありがとう
"""

_PUNCTUATION = list(".,!?;:'\"()[]{}<>-_/\\@#$%&*+=~`^|…«»¿¡€£°")

BERT_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
XLMR_SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
# Common endings as continuation pieces, so inflected forms of listed words ("resets", "charged") split into a word
# and an ending rather than into characters.
_SUFFIXES = ["s", "es", "ed", "ing", "er", "ers", "ly", "tion", "ment", "ness", "able", "ful", "less", "est"]

_TOKENIZER_FILES = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "sentencepiece.bpe.model",
    "spiece.model",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
]
_WEIGHT_PATTERNS = ["*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json", "*.pt", "*.pth"]
# Other frameworks' and exported weights too (TensorFlow, Flax, ONNX, OpenVINO's .xml + .bin), so none is left over.
_WEIGHT_PATTERNS += ["*.ckpt", "*.h5", "*.msgpack", "*.onnx", "*.xml"]


def _words() -> list[str]:
    return _ENGLISH.split() + _MULTILINGUAL.split()


def _alphabet(words: list[str]) -> list[str]:
    """Every character of WORDS plus ASCII letters, digits and punctuation: unknown words made of these split into
    pieces; only characters outside it become the unknown token."""
    ascii_chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return sorted({char for word in words for char in word} | set(ascii_chars) | set(_PUNCTUATION))


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


# The vocabularies are listed from the word lists rather than learnt with tokenizers' trainers: those break ties in
# HashMap order, so each run (even in one process) learns a different vocabulary, hence different vocabulary sizes
# and weights. Written out like this, the same call always gives the same ids.


def _wordpiece_tokenizer() -> "Tokenizer":
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words = [piece for word in _words() for piece, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(word))]
    alphabet = _alphabet(words)
    pieces = BERT_SPECIAL_TOKENS + alphabet + [f"##{char}" for char in alphabet] + words
    pieces += [f"##{suffix}" for suffix in _SUFFIXES]
    vocab = {piece: i for i, piece in enumerate(_unique(pieces))}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    # Normaliser, pre-tokeniser and decoder are the ones transformers' BertTokenizer rebuilds on load (it keeps only
    # the vocabulary and post-processor of tokenizer.json), so the saved folder tokenises like this object.
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    return tokenizer


def _unigram_pieces() -> list[tuple[str, float]]:
    """SentencePiece-style pieces with log-probabilities: a whole listed word beats any split of it, an ending beats
    its characters. Cased like XLM-R and DeBERTa-v3: test sentences start with capitals."""
    words = _words()
    words += [word.capitalize() for word in words]
    pieces = [(f"\u2581{word}", -8.0) for word in words]
    pieces += [(suffix, -9.0) for suffix in _SUFFIXES]
    pieces += [("\u2581", -10.0)] + [(char, -12.0) for char in _alphabet(words)]
    scores: dict[str, float] = {}
    for piece, score in pieces:
        scores.setdefault(piece, score)
    return list(scores.items())


def _unigram_tokenizer() -> "Tokenizer":
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    scores = dict.fromkeys(XLMR_SPECIAL_TOKENS, 0.0)
    for piece, score in _unigram_pieces():
        scores.setdefault(piece, score)
    vocab = list(scores.items())
    # Same structure as transformers' XLMRobertaTokenizer rebuilds on load: no normaliser (cased, accents kept),
    # whitespace split then metaspace with a prefix space, <unk> at id 3.
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=XLMR_SPECIAL_TOKENS.index("<unk>"), byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")]
    )
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    return tokenizer


def bert_tokenizer(
    model_max_length: int = CLASSIFIER_MAX_LENGTH, distilbert: bool = False
) -> "PreTrainedTokenizerBase":
    """The lowercasing WordPiece tokenizer as a transformers tokenizer.

    DISTILBERT picks DistilBertTokenizerFast: its model_input_names leave out token_type_ids, which DistilBERT has no
    embedding for, and tokenizer_config.json then names DistilBertTokenizer, so AutoTokenizer gives that class back.
    """
    from transformers import BertTokenizerFast, DistilBertTokenizerFast

    tokenizer_class = DistilBertTokenizerFast if distilbert else BertTokenizerFast
    return tokenizer_class(
        tokenizer_object=_wordpiece_tokenizer(), model_max_length=model_max_length, do_lower_case=True
    )


def xlmr_tokenizer(model_max_length: int = CLASSIFIER_MAX_LENGTH) -> "PreTrainedTokenizerBase":
    """The cased Unigram tokenizer as a transformers XLM-RoBERTa tokenizer (<s>=0, <pad>=1, </s>=2, <unk>=3)."""
    from transformers import XLMRobertaTokenizerFast

    return XLMRobertaTokenizerFast(
        tokenizer_object=_unigram_tokenizer(),
        model_max_length=model_max_length,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
    )


def make_tokenizer_bert(folder: Path, model_max_length: int = CLASSIFIER_MAX_LENGTH) -> Path:
    """Write the lowercasing WordPiece tokenizer (tokenizer.json, tokenizer_config.json) into FOLDER."""
    folder.mkdir(parents=True, exist_ok=True)
    bert_tokenizer(model_max_length).save_pretrained(str(folder))
    return folder


def make_tokenizer_xlmr(folder: Path, model_max_length: int = CLASSIFIER_MAX_LENGTH) -> Path:
    """Write the cased Unigram XLM-RoBERTa-style tokenizer (tokenizer.json, tokenizer_config.json) into FOLDER."""
    folder.mkdir(parents=True, exist_ok=True)
    xlmr_tokenizer(model_max_length).save_pretrained(str(folder))
    return folder


def _encoder_sizes() -> dict[str, float]:
    return {
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": INTERMEDIATE,
        "initializer_range": INITIALIZER_RANGE,
    }


# "minilm": all-MiniLM-L6-v2's shape (6 layers, 384 wide), for benchmarks of another architecture at a real cost.
SIZES = {
    "tiny": _encoder_sizes(),
    # all-mpnet-base-v2's and bge-base's shape: 768 wide, 12 layers (~110 M parameters with a 30k vocabulary).
    "base": {
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "initializer_range": 0.02,
    },
    "minilm": {
        "hidden_size": 384,
        "num_hidden_layers": 6,
        "num_attention_heads": 12,
        "intermediate_size": 1536,
        "initializer_range": 0.02,
    },
}


def _save_sentence_transformer(
    model: "PreTrainedModel",
    tokenizer: "PreTrainedTokenizerBase",
    folder: Path,
    pooling_mode: str,
    normalize: bool,
    max_seq_length: int,
    max_seq_length_in_config: bool,
    **model_kwargs,
) -> Path:
    """Save MODEL and TOKENIZER as Transformer -> Pooling [-> Normalize] the way sentence-transformers itself does."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    # The Transformer module only loads from a folder, so the Hugging Face model goes through a scratch one.
    with tempfile.TemporaryDirectory() as scratch:
        model.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        transformer = Transformer(scratch, max_seq_length=max_seq_length)
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling_mode)]
    if normalize:
        modules.append(Normalize())
    folder.mkdir(parents=True, exist_ok=True)
    SentenceTransformer(modules=modules, device="cpu", **model_kwargs).save(str(folder))
    if max_seq_length_in_config:
        # sentence-transformers 6 keeps the limit only as the tokenizer's model_max_length; 2.x-5.x also wrote it
        # here, and 6 still reads it, so most folders users bring have it.
        path = folder / "sentence_bert_config.json"
        path.write_text(json.dumps({"max_seq_length": max_seq_length, **json.loads(path.read_text())}, indent=4))
    return folder


def make_bert_cls_normalize_embedder(
    folder: Path, max_seq_length: int = 64, *, max_seq_length_in_config: bool = True
) -> Path:
    """A sentence-transformers BERT embedder: Transformer -> Pooling(cls) -> Normalize, 32-dimensional, unit length.

    max_seq_length goes into the tokenizer's model_max_length and, unless MAX_SEQ_LENGTH_IN_CONFIG is false (the
    layout sentence-transformers 6 writes), into sentence_bert_config.json too.
    """
    from transformers import BertConfig, BertModel

    tokenizer = bert_tokenizer(max_seq_length)
    config = BertConfig(
        vocab_size=len(tokenizer), max_position_embeddings=max(BERT_POSITIONS, max_seq_length), **_encoder_sizes()
    )
    torch.manual_seed(SEED)
    # With its pooler: AutoModel, which sentence-transformers loads with, would otherwise add one of unseeded weights.
    model = BertModel(config)
    return _save_sentence_transformer(model, tokenizer, folder, "cls", True, max_seq_length, max_seq_length_in_config)


def make_xlmr_mean_prompts_embedder(
    folder: Path, max_seq_length: int = 64, *, max_seq_length_in_config: bool = True, size: str = "tiny"
) -> Path:
    """A sentence-transformers XLM-RoBERTa embedder: mean pooling, no Normalize, prompts "query: " / "passage: ".

    No default prompt: encode() without prompt_name adds none. sentence-transformers 6 also saves its own empty
    "query" / "document" prompts unless given others, so config_sentence_transformers.json lists "query",
    "passage" and "document" (the last as "").
    """
    from transformers import XLMRobertaConfig, XLMRobertaModel

    tokenizer = xlmr_tokenizer(max_seq_length)
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer),
        # RoBERTa numbers positions from pad_token_id + 1, so max_seq_length tokens need two rows more.
        max_position_embeddings=max_seq_length + 2,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        type_vocab_size=1,
        **SIZES[size],
    )
    torch.manual_seed(SEED)
    model = XLMRobertaModel(config)
    prompts = {"query": "query: ", "passage": "passage: "}
    return _save_sentence_transformer(
        model, tokenizer, folder, "mean", False, max_seq_length, max_seq_length_in_config, prompts=prompts
    )


_LEGACY_MODULE_TYPES = {
    "sentence_transformers.base.modules.transformer.Transformer": "sentence_transformers.models.Transformer",
    "sentence_transformers.sentence_transformer.modules.pooling.Pooling": "sentence_transformers.models.Pooling",
    "sentence_transformers.base.modules.normalize.Normalize": "sentence_transformers.models.Normalize",
}
_LEGACY_POOLING_FLAGS = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "max": "pooling_mode_max_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}


def to_legacy_layout(folder: Path, source: Path | None = None) -> Path:
    """Rewrite a sentence-transformers folder's module files the way sentence-transformers 3.x-5.x wrote them.

    That is the layout of most embedding models on the hub: modules.json types `sentence_transformers.models.*`,
    1_Pooling/config.json with word_embedding_dimension and one pooling_mode_* flag per mode,
    sentence_bert_config.json with max_seq_length and do_lower_case only, no 2_Normalize/config.json.
    sentence-transformers 6 loads it to the same model. FOLDER is rewritten in place (a copy of SOURCE when given).
    """
    _copied(folder, source)
    modules_path = folder / "modules.json"
    modules = json.loads(modules_path.read_text())
    for module in modules:
        module["type"] = _LEGACY_MODULE_TYPES.get(module["type"], module["type"])
    modules_path.write_text(json.dumps(modules, indent=2))
    pooling_path = folder / "1_Pooling" / "config.json"
    pooling = json.loads(pooling_path.read_text())
    modes = [pooling["pooling_mode"]] if isinstance(pooling["pooling_mode"], str) else pooling["pooling_mode"]
    legacy = {"word_embedding_dimension": pooling["embedding_dimension"]}
    legacy |= {flag: mode in modes for mode, flag in _LEGACY_POOLING_FLAGS.items()}
    legacy["include_prompt"] = pooling.get("include_prompt", True)
    pooling_path.write_text(json.dumps(legacy, indent=4))
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    transformer_path = folder / "sentence_bert_config.json"
    transformer = json.loads(transformer_path.read_text())
    max_seq_length = transformer.get("max_seq_length", tokenizer_config["model_max_length"])
    transformer_path.write_text(json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}, indent=4))
    shutil.rmtree(folder / "2_Normalize", ignore_errors=True)
    return folder


def _save_hf(model: "PreTrainedModel", tokenizer: "PreTrainedTokenizerBase", folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def _label_maps(labels: Sequence[str]) -> dict[str, dict]:
    return {"id2label": dict(enumerate(labels)), "label2id": {label: i for i, label in enumerate(labels)}}


def make_distilbert_classifier(folder: Path, labels: Sequence[str] = ("negative", "neutral", "positive")) -> Path:
    """A single-label DistilBertForSequenceClassification with LABELS, plus a tokenizer without token_type_ids."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    tokenizer = bert_tokenizer(CLASSIFIER_MAX_LENGTH, distilbert=True)
    config = DistilBertConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=CLASSIFIER_MAX_LENGTH,
        dim=HIDDEN,
        n_layers=LAYERS,
        n_heads=HEADS,
        hidden_dim=INTERMEDIATE,
        initializer_range=INITIALIZER_RANGE,
        pad_token_id=tokenizer.pad_token_id,
        problem_type="single_label_classification",
        **_label_maps(labels),
    )
    torch.manual_seed(SEED)
    return _save_hf(DistilBertForSequenceClassification(config), tokenizer, folder)


def make_bert_multilabel_classifier(
    folder: Path, labels: Sequence[str] = ("toxic", "insult", "threat", "spam")
) -> Path:
    """A BertForSequenceClassification with problem_type multi_label_classification (a sigmoid per label)."""
    from transformers import BertConfig, BertForSequenceClassification

    tokenizer = bert_tokenizer(CLASSIFIER_MAX_LENGTH)
    config = BertConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=CLASSIFIER_MAX_LENGTH,
        problem_type="multi_label_classification",
        **_label_maps(labels),
        **_encoder_sizes(),
    )
    torch.manual_seed(SEED)
    return _save_hf(BertForSequenceClassification(config), tokenizer, folder)


def make_cross_encoder(
    folder: Path,
    max_length: int = CLASSIFIER_MAX_LENGTH,
    *,
    layout: Literal["sentence_transformers", "transformers"] = "sentence_transformers",
    size: str = "tiny",
) -> Path:
    """A BERT cross-encoder reranker, one logit per (query, passage) pair, that `CrossEncoder(str(folder))` loads.

    LAYOUT "sentence_transformers" saves it through `CrossEncoder.save` as sentence-transformers 6 does: modules.json
    (one Transformer, transformer_task "sequence-classification"), sentence_bert_config.json and
    config_sentence_transformers.json (model_type "CrossEncoder", activation_fn "torch.nn.modules.activation.Sigmoid").
    LAYOUT "transformers" is only `save_pretrained` of BertForSequenceClassification (num_labels=1) and the
    tokenizer, like many cross-encoders on the hub; CrossEncoder loads that too.

    Either way `CrossEncoder.predict` applies a sigmoid for num_labels=1 in sentence-transformers 6.2 (identity for
    more labels), so its scores are sigmoid(logit) in (0, 1), not the raw logits. SIZE "minilm" gives it
    MiniLM-L6's shape: what a small real cross-encoder costs per pair, with meaningless scores.
    """
    from transformers import BertConfig, BertForSequenceClassification

    tokenizer = bert_tokenizer(max_length)
    config = BertConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=max(BERT_POSITIONS, max_length),
        num_labels=1,
        **SIZES[size],
    )
    torch.manual_seed(SEED)
    model = BertForSequenceClassification(config)
    if layout == "transformers":
        return _save_hf(model, tokenizer, folder)
    from sentence_transformers import CrossEncoder

    with tempfile.TemporaryDirectory() as scratch:
        _save_hf(model, tokenizer, Path(scratch))
        cross_encoder = CrossEncoder(scratch, device="cpu")
    folder.mkdir(parents=True, exist_ok=True)
    cross_encoder.save(str(folder))
    return folder


def _copied(folder: Path, source: Path | None) -> Path:
    if source is not None:
        if folder.exists():
            shutil.rmtree(folder)
        shutil.copytree(source, folder)
    return folder


def break_no_weights(folder: Path, source: Path | None = None) -> Path:
    """Delete every weight file (safetensors, .bin, ONNX, ...) from FOLDER.

    Every break_* function changes FOLDER in place, after copying SOURCE there first when it is given (replacing
    whatever FOLDER held), and returns FOLDER.
    """
    _copied(folder, source)
    for pattern in _WEIGHT_PATTERNS:
        for path in folder.rglob(pattern):
            path.unlink()
    return folder


def break_bin_only(folder: Path, source: Path | None = None) -> Path:
    """Replace model.safetensors by a pickled pytorch_model.bin of the same state dict.

    transformers 5 and sentence-transformers 6.2 still load such a folder: refusing it is packaging's own policy.
    """
    from safetensors.torch import load_file

    _copied(folder, source)
    weights = folder / "model.safetensors"
    torch.save(load_file(str(weights)), folder / "pytorch_model.bin")
    weights.unlink()
    return folder


def break_pooling_mode(folder: Path, source: Path | None = None) -> Path:
    """Put an unknown pooling mode into 1_Pooling/config.json, as both a current and a legacy (2.x-5.x) key.

    sentence-transformers 6.2 fails to load either (TypeError for the flag, which it meets first; ValueError
    "Invalid pooling mode" for the mode alone).
    """
    _copied(folder, source)
    path = folder / "1_Pooling" / "config.json"
    config = json.loads(path.read_text())
    config["pooling_mode"] = "bogus"
    config["pooling_mode_bogus_tokens"] = True
    path.write_text(json.dumps(config, indent=4))
    return folder


def break_architecture(folder: Path, source: Path | None = None) -> Path:
    """Replace config.json by a valid GPT-Neo one, an architecture packaging does not support; the weights stay.

    Architectures map by head (BertModel -> GPTNeoModel, ...ForSequenceClassification ->
    GPTNeoForSequenceClassification); labels and problem_type are kept. Only model_type and architectures changing
    would not do: transformers 5 then fails in AutoConfig (GPT-Neo's config rejects BERT's classifier_dropout=None)
    before any architecture check could refuse it. As written, transformers and sentence-transformers load the folder
    as a GPT-Neo with fresh random weights (none of the BERT names match), so only an architecture check refuses it.
    """
    from transformers import GPTNeoConfig

    _copied(folder, source)
    path = folder / "config.json"
    old = json.loads(path.read_text())
    config = GPTNeoConfig(
        vocab_size=old["vocab_size"],
        max_position_embeddings=old.get("max_position_embeddings", BERT_POSITIONS),
        hidden_size=HIDDEN,
        num_layers=LAYERS,
        num_heads=HEADS,
        attention_types=[[["global", "local"], LAYERS // 2]],
        **{key: old[key] for key in ("id2label", "label2id", "problem_type") if key in old},
    )
    config.architectures = [re.sub(r"^.*?(For\w+|Model)$", r"GPTNeo\1", name) for name in old["architectures"]]
    path.write_text(config.to_json_string())
    return folder


def break_tokenizer(folder: Path, source: Path | None = None) -> Path:
    """Delete tokenizer.json and every other tokenizer file (vocab.txt, sentencepiece models, tokenizer_config.json).

    Loading does not fail for it: transformers 5's AutoTokenizer still builds the model type's tokenizer with only its
    5 special tokens (every word [UNK]), and SentenceTransformer / CrossEncoder load with that. Packaging has to look
    for the files itself.
    """
    _copied(folder, source)
    for name in _TOKENIZER_FILES:
        (folder / name).unlink(missing_ok=True)
    return folder


# --architecture of the command line: a random model folder of the layout teams bring, for measurements.
ARCHITECTURES = {
    "xlm-roberta": lambda out, tokens, size: make_xlmr_mean_prompts_embedder(out, tokens, size=size),
    "mpnet": lambda out, tokens, size: make_mpnet_mean_normalize_embedder(out, tokens, size=size),
    "bert-dense": lambda out, tokens, size: make_bert_cls_dense_normalize_embedder(out, tokens, 256, size=size),
    "qwen3": lambda out, tokens, size: make_qwen3_decoder_embedder(out, tokens, size=size),
    "deberta-v2": lambda out, tokens, size: make_deberta_nli_classifier(out, size=size, max_length=tokens),
    "modernbert": lambda out, tokens, size: make_modernbert_classifier(out, size=size, max_length=tokens),
    "electra": lambda out, tokens, size: make_electra_classifier(out, size=size, max_length=tokens),
    "splade": lambda out, tokens, size: make_splade_encoder(out, tokens, size=size),
    "multi-vector": lambda out, tokens, size: make_multi_vector_encoder(out, tokens, size=size),
}


def main(argv: list[str] | None = None) -> int:
    """A random model folder for measurements:
    python -m scripts.tiny_text_models --out DIR [--architecture mpnet] [--size base] [--tokens 256]."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m scripts.tiny_text_models", description=main.__doc__)
    parser.add_argument("--out", type=Path, required=True, help="folder to write the model to")
    parser.add_argument("--architecture", choices=sorted(ARCHITECTURES), default="xlm-roberta")
    parser.add_argument("--size", choices=sorted(SIZES), default="minilm")
    parser.add_argument("--tokens", type=int, default=256, help="the token limit (default 256, as minilm)")
    args = parser.parse_args(argv)
    ARCHITECTURES[args.architecture](args.out, args.tokens, args.size)
    print(f"wrote a random {args.size}-sized {args.architecture} model to {args.out}")
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# Architectures beyond BERT/XLM-R/DistilBERT, and the sentence-transformers module chains and kinds that users bring.


def _byte_level_tokenizer(padding_side: str = "left") -> "PreTrainedTokenizerBase":
    """A Qwen2-style byte-level BPE tokenizer (every byte a token, no merges) whose post-processor appends
    <|endoftext|>, as Qwen3-Embedding's does; it pads on the left, as decoder embedders' tokenizers do."""
    from tokenizers import pre_tokenizers, processors
    from transformers import Qwen2TokenizerFast

    vocab = {char: i for i, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    eos = "<|endoftext|>"
    vocab[eos] = len(vocab)
    tokenizer = Qwen2TokenizerFast(vocab=vocab, merges=[], padding_side=padding_side, model_max_length=512)
    tokenizer.backend_tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"$A {eos}", pair=f"$A {eos} $B:1 {eos}:1", special_tokens=[(eos, vocab[eos])]
            ),
        ]
    )
    return tokenizer


def _positions(max_seq_length: int) -> int:
    return max(BERT_POSITIONS, max_seq_length)


def _sentence_transformer_folder(modules: list, folder: Path, **model_kwargs) -> Path:
    from sentence_transformers import SentenceTransformer

    folder.mkdir(parents=True, exist_ok=True)
    SentenceTransformer(modules=modules, device="cpu", **model_kwargs).save(str(folder))
    return folder


def _transformer_module(model: "PreTrainedModel", tokenizer: "PreTrainedTokenizerBase", max_seq_length: int, **kw):
    """sentence-transformers' Transformer module around MODEL (it loads only from a folder: a scratch one)."""
    from sentence_transformers.base.modules import Transformer

    with tempfile.TemporaryDirectory() as scratch:
        model.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        return Transformer(scratch, max_seq_length=max_seq_length, **kw)


def make_mpnet_mean_normalize_embedder(folder: Path, max_seq_length: int = 64, *, size: str = "tiny") -> Path:
    """all-mpnet-base-v2's layout: MPNet -> Pooling(mean) -> Normalize. SIZE "base" is all-mpnet-base-v2's shape
    (768 wide, 12 layers, 110 M parameters) with random weights, for measurements."""
    from sentence_transformers.base.modules import Normalize
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import MPNetConfig, MPNetModel, MPNetTokenizerFast

    base = bert_tokenizer(max_seq_length)
    tokenizer = MPNetTokenizerFast(
        vocab=dict(base.get_vocab()),
        do_lower_case=True,
        bos_token="[CLS]",
        eos_token="[SEP]",
        sep_token="[SEP]",
        cls_token="[CLS]",
        unk_token="[UNK]",
        pad_token="[PAD]",
        mask_token="[MASK]",
        model_max_length=max_seq_length,
    )
    sizes = SIZES[size]
    config = MPNetConfig(
        vocab_size=len(tokenizer),
        # MPNet numbers positions from pad_token_id + 1, as RoBERTa does.
        max_position_embeddings=max(BERT_POSITIONS, max_seq_length) + 2,
        pad_token_id=tokenizer.pad_token_id,
        **sizes,
    )
    torch.manual_seed(SEED)
    transformer = _transformer_module(MPNetModel(config), tokenizer, max_seq_length)
    dimension = transformer.get_embedding_dimension()
    return _sentence_transformer_folder([transformer, Pooling(dimension, "mean"), Normalize()], folder)


def make_bert_cls_dense_normalize_embedder(
    folder: Path, max_seq_length: int = 64, out_features: int = 16, *, size: str = "tiny"
) -> Path:
    """LaBSE's layout: BERT -> Pooling(cls) -> Dense(tanh) -> Normalize; the Dense projects 32 -> OUT_FEATURES."""
    from sentence_transformers.base.modules import Dense, Normalize
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import BertConfig, BertModel

    tokenizer = bert_tokenizer(max_seq_length)
    config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=_positions(max_seq_length), **SIZES[size])
    torch.manual_seed(SEED)
    transformer = _transformer_module(BertModel(config), tokenizer, max_seq_length)
    width = config.hidden_size
    dense = Dense(width, out_features, activation_function=torch.nn.Tanh())
    torch.nn.init.normal_(dense.linear.weight, std=INITIALIZER_RANGE if size == "tiny" else width**-0.5)
    return _sentence_transformer_folder([transformer, Pooling(width, "cls"), dense, Normalize()], folder)


def make_bert_prompt_layernorm_embedder(folder: Path, max_seq_length: int = 64, truncate_dim: int = 16) -> Path:
    """INSTRUCTOR/E5-style details in one folder: BERT -> Pooling(mean, include_prompt false: the prompt's tokens are
    left out of the mean) -> LayerNorm, a "query: " prompt, and a truncate_dim (Matryoshka-style) that cuts every
    vector to its first TRUNCATE_DIM floats in encode()."""
    from sentence_transformers.sentence_transformer.modules import LayerNorm, Pooling
    from transformers import BertConfig, BertModel

    tokenizer = bert_tokenizer(max_seq_length)
    config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=BERT_POSITIONS, **_encoder_sizes())
    torch.manual_seed(SEED)
    transformer = _transformer_module(BertModel(config), tokenizer, max_seq_length)
    norm = LayerNorm(HIDDEN)
    torch.nn.init.normal_(norm.norm.weight, mean=1.0, std=0.3)
    modules = [transformer, Pooling(HIDDEN, "mean", include_prompt=False), norm]
    return _sentence_transformer_folder(
        modules, folder, prompts={"query": "query: ", "passage": "passage: "}, truncate_dim=truncate_dim
    )


def make_qwen3_decoder_embedder(folder: Path, max_seq_length: int = 128, *, size: str = "tiny") -> Path:
    """Qwen3-Embedding's layout: a Qwen3 decoder -> Pooling(lasttoken) -> Normalize, a tokenizer that appends
    <|endoftext|> and pads on the left, and an instruction prompt "query" (no default prompt)."""
    from sentence_transformers.base.modules import Normalize
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import Qwen3Config, Qwen3Model

    tokenizer = _byte_level_tokenizer()
    sizes = SIZES[size]
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=sizes["hidden_size"],
        intermediate_size=sizes["intermediate_size"],
        num_hidden_layers=sizes["num_hidden_layers"],
        num_attention_heads=sizes["num_attention_heads"],
        num_key_value_heads=sizes["num_attention_heads"] // 2,
        head_dim=sizes["hidden_size"] // sizes["num_attention_heads"],
        max_position_embeddings=max(512, max_seq_length),
        initializer_range=sizes["initializer_range"],
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(SEED)
    transformer = _transformer_module(Qwen3Model(config), tokenizer, max_seq_length)
    prompts = {"query": "Instruct: Given a web search query, retrieve relevant passages\nQuery:", "document": ""}
    modules = [transformer, Pooling(sizes["hidden_size"], "lasttoken"), Normalize()]
    return _sentence_transformer_folder(modules, folder, prompts=prompts)


def make_deberta_nli_classifier(
    folder: Path, labels: Sequence[str] = NLI_LABELS, *, size: str = "tiny", max_length: int = CLASSIFIER_MAX_LENGTH
) -> Path:
    """A DeBERTa-v2 (v3-style: no token type embeddings) NLI classifier over text pairs with a SentencePiece-style
    Unigram tokenizer ([CLS] a [SEP] b [SEP])."""
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification, DebertaV2TokenizerFast

    pieces = _unigram_pieces()
    specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    vocab = [(token, 0.0) for token in specials] + [p for p in pieces if p[0] not in specials]
    tokenizer = DebertaV2TokenizerFast(vocab=vocab, unk_id=3, model_max_length=max_length)
    config = DebertaV2Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_length,
        type_vocab_size=0,
        relative_attention=True,
        position_buckets=32,
        max_relative_positions=-1,
        pos_att_type=["p2c", "c2p"],
        position_biased_input=False,
        pad_token_id=tokenizer.pad_token_id,
        problem_type="single_label_classification",
        **_label_maps(labels),
        **SIZES[size],
    )
    torch.manual_seed(SEED)
    return _save_hf(DebertaV2ForSequenceClassification(config), tokenizer, folder)


def make_modernbert_classifier(
    folder: Path, labels: Sequence[str] = ("negative", "positive"), *, size: str = "tiny", max_length: int = 128
) -> Path:
    """A ModernBERT sequence classifier (rotary positions, alternating local/global attention); its tokenizer class is
    the generic fast one, which sends no token_type_ids."""
    from transformers import ModernBertConfig, ModernBertForSequenceClassification, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_wordpiece_tokenizer(),
        model_max_length=max_length,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "attention_mask"],
    )
    sizes = SIZES[size]
    config = ModernBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=sizes["hidden_size"],
        intermediate_size=sizes["intermediate_size"],
        num_hidden_layers=sizes["num_hidden_layers"],
        num_attention_heads=sizes["num_attention_heads"],
        max_position_embeddings=max_length,
        local_attention=16 if size == "tiny" else 128,
        global_attn_every_n_layers=2 if size == "tiny" else 3,
        initializer_range=sizes["initializer_range"],
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        **_label_maps(labels),
    )
    torch.manual_seed(SEED)
    return _save_hf(ModernBertForSequenceClassification(config), tokenizer, folder)


def make_electra_classifier(
    folder: Path, labels: Sequence[str] = ("not_duplicate", "duplicate"), *, size: str = "tiny", max_length: int = 128
) -> Path:
    """An ELECTRA pair classifier (ELECTRA-style duplicate-question models), BERT's tokenizer with segment ids."""
    from transformers import ElectraConfig, ElectraForSequenceClassification, ElectraTokenizerFast

    tokenizer = ElectraTokenizerFast(vocab=dict(bert_tokenizer().get_vocab()), model_max_length=max_length)
    config = ElectraConfig(
        vocab_size=len(tokenizer),
        embedding_size=SIZES[size]["hidden_size"] // 2,
        max_position_embeddings=max_length,
        problem_type="single_label_classification",
        **_label_maps(labels),
        **SIZES[size],
    )
    torch.manual_seed(SEED)
    return _save_hf(ElectraForSequenceClassification(config), tokenizer, folder)


def make_bert_pair_classifier_without_segments(folder: Path) -> Path:
    """A BERT NLI classifier whose tokenizer does not list token_type_ids in model_input_names: transformers sends
    none, so the model sees segment 0 for both texts of a pair (the served inputs must do the same)."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    tokenizer = BertTokenizerFast(
        tokenizer_object=_wordpiece_tokenizer(),
        model_max_length=CLASSIFIER_MAX_LENGTH,
        model_input_names=["input_ids", "attention_mask"],
    )
    config = BertConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=CLASSIFIER_MAX_LENGTH,
        problem_type="single_label_classification",
        **_label_maps(NLI_LABELS),
        **_encoder_sizes(),
    )
    torch.manual_seed(SEED)
    return _save_hf(BertForSequenceClassification(config), tokenizer, folder)


def make_splade_encoder(folder: Path, max_seq_length: int = 64, *, size: str = "tiny") -> Path:
    """A SPLADE sparse encoder as sentence-transformers' SparseEncoder saves it: BERT masked-LM -> SpladePooling(max,
    relu). The MLM head's bias is pushed negative so most vocabulary weights are zero, as in a trained SPLADE."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling
    from transformers import BertConfig, BertForMaskedLM

    tokenizer = bert_tokenizer(max_seq_length)
    config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=_positions(max_seq_length), **SIZES[size])
    torch.manual_seed(SEED)
    model = BertForMaskedLM(config)
    with torch.no_grad():
        model.cls.predictions.bias.fill_(-4.0)
    transformer = _transformer_module(model, tokenizer, max_seq_length, transformer_task="fill-mask")
    folder.mkdir(parents=True, exist_ok=True)
    SparseEncoder(modules=[transformer, SpladePooling("max")], device="cpu").save(str(folder))
    return folder


def make_multi_vector_encoder(folder: Path, max_seq_length: int = 64, *, size: str = "tiny") -> Path:
    """A ColBERT-style multi-vector encoder as sentence-transformers' MultiVectorEncoder builds it from a BERT:
    Transformer -> Dense(token_embeddings, 32 -> 128, no bias) -> MultiVectorMask -> Normalize(token_embeddings),
    with "[Q] " / "[D] " prompts for queries and documents."""
    from sentence_transformers import MultiVectorEncoder
    from transformers import BertConfig, BertModel

    tokenizer = bert_tokenizer(max_seq_length)
    config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=_positions(max_seq_length), **SIZES[size])
    torch.manual_seed(SEED)
    with tempfile.TemporaryDirectory() as scratch:
        BertModel(config).save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        model = MultiVectorEncoder(scratch, device="cpu", prompts={"query": "[Q] ", "document": "[D] "})
    model[0].max_seq_length = max_seq_length
    folder.mkdir(parents=True, exist_ok=True)
    model.save(str(folder))
    return folder


def with_remote_code(folder: Path, source: Path | None = None) -> Path:
    """Add an ``auto_map`` to config.json naming code in the folder (as gte-new, nomic and jina models do) and that
    code: a subclass of the architecture's own model, so that trust_remote_code=True loads the same weights."""
    _copied(folder, source)
    path = folder / "config.json"
    config = json.loads(path.read_text())
    base = {"bert": "Bert", "mpnet": "MPNet", "xlm-roberta": "XLMRoberta"}[config["model_type"]]
    config["auto_map"] = {"AutoConfig": "custom_model.CustomConfig", "AutoModel": "custom_model.CustomModel"}
    path.write_text(json.dumps(config, indent=2))
    (folder / "custom_model.py").write_text(
        f"from transformers import {base}Config, {base}Model\n\n\n"
        f"class CustomConfig({base}Config):\n    model_type = {config['model_type']!r}\n\n\n"
        f"class CustomModel({base}Model):\n    config_class = CustomConfig\n"
    )
    return folder


# ---------------------------------------------------------------------------------------------------------------------
# What the reference libraries answer for a folder: what the served answers are compared with, in and out of process.


def reference_embeddings(folder: Path, texts: Sequence[str], prompt_name: str | None = None) -> torch.Tensor:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return model.encode(list(texts), prompt_name=prompt_name, convert_to_tensor=True).float()


def reference_probabilities(folder: Path, rows: Sequence) -> tuple[list[torch.Tensor], dict[int, str]]:
    """Per row (a text or a [text, pair]), transformers' probabilities by label index, and id2label."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(str(folder), local_files_only=True).eval()
    multi_label = model.config.problem_type == "multi_label_classification"
    out = []
    with torch.inference_mode():
        for row in rows:
            first, second = (row, None) if isinstance(row, str) else row
            logits = model(**tokenizer(first, second, truncation=True, return_tensors="pt")).logits[0]
            out.append(torch.sigmoid(logits) if multi_label else torch.softmax(logits, -1))
    return out, model.config.id2label


def reference_sparse(folder: Path, texts: Sequence[str]) -> torch.Tensor:
    """SparseEncoder.encode()'s weights as dense [texts, vocabulary] rows."""
    from sentence_transformers import SparseEncoder

    return SparseEncoder(str(folder), device="cpu").encode(list(texts), convert_to_tensor=True).to_dense().float()


def dense_sparse(entries: Sequence[dict], size: int) -> torch.Tensor:
    """A served sparse answer ([{"index", "value"}, ...]) as a dense row."""
    row = torch.zeros(size)
    for entry in entries:
        row[entry["index"]] = entry["value"]
    return row


def reference_multi_vector(folder: Path, texts: Sequence[str], task: str = "document") -> list[torch.Tensor]:
    from sentence_transformers import MultiVectorEncoder

    model = MultiVectorEncoder(str(folder), device="cpu")
    encode = model.encode_query if task == "query" else model.encode_document
    return [vectors.float() for vectors in encode(list(texts))]


if __name__ == "__main__":
    raise SystemExit(main())
