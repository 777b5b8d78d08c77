"""handler.precision for the generator (handlers/generation/precision.py): bf16 decodes with an fp32 output layer,
and serves only where the CPU computes bf16 natively and greedy decoding of the gate prompts gives fp32's tokens with
their log probabilities within the threshold; otherwise fp32 serves and describe says why, with the gate's figures.

Two variants of the demo model, made here from its folder: a peaked one (its output layer scaled 3 times: clear
choices) and a flat one, whose near-uniform logits ride on a constant the last hidden state carries (ten times its
informative part): bf16 rounds that sum, and greedy choices among near-equal logits flip, while the cosine of the
next-token logits to fp32's still passes the cosine gate. make test runs these again as an AVX2 CPU (marker
cpu_kind), where bf16 is refused for the CPU before any gate."""

import json
import math
import shutil

import pytest
import torch

from handlers.core import cpu, runtime
from handlers.generation import precision
from handlers.generation.gate import GATE_TOKENS, greedy_sequences
from scripts.ops.handler_loader import ContinuousFrontend, load_handler

pytestmark = pytest.mark.cpu_kind

CPU = torch.device("cpu")
NO_NATIVE_BF16 = "this CPU has no native bf16 (neither avx512_bf16 nor amx_bf16)"


def peak(model):
    model.lm_head.weight.mul_(3.0)


def flatten(model):
    # Rows of the output layer that sum to 0 ignore a constant added to every hidden unit; ln_f's gain and bias
    # shrunk 10 times leave near-uniform logits, and the constant 1 added to its output is what bf16 must round.
    model.lm_head.weight.sub_(model.lm_head.weight.mean(dim=1, keepdim=True))
    model.transformer.ln_f.weight.mul_(0.1)
    model.transformer.ln_f.bias.mul_(0.1).add_(1.0)


def variant(source, target, change):
    """A copy of the demo model's folder with its weights changed by ``change(model)``."""
    from transformers import AutoModelForCausalLM

    shutil.copytree(source, target)
    (target / "identity.json").unlink(missing_ok=True)  # the content changes: the worker computes its identity
    shutil.rmtree(target / "decode", ignore_errors=True)  # and the package-time build belongs to other weights
    model = AutoModelForCausalLM.from_pretrained(target / "lm", dtype=torch.float32)
    with torch.no_grad():
        change(model)
    model.save_pretrained(target / "lm", safe_serialization=True)
    return target


@pytest.fixture(scope="module")
def peaked_dir(prepared_model_dir, tmp_path_factory):
    return variant(prepared_model_dir("generator"), tmp_path_factory.mktemp("peaked") / "model", peak)


@pytest.fixture(scope="module")
def echo_dir(prepared_model_dir, tmp_path_factory):
    """The demo's folder with a model of clear choices whatever the CPU's bf16 rounding: input and output
    embeddings tied and scaled 8 times, so each next token is the current one by a margin of nats (its top two
    log probabilities differ by 4.6 or more on the gate prompts), where the demo's choices hang on hundredths."""
    from transformers import AutoConfig, GPT2Config, GPT2LMHeadModel

    target = tmp_path_factory.mktemp("echo") / "model"
    shutil.copytree(prepared_model_dir("generator"), target)
    (target / "identity.json").unlink(missing_ok=True)
    shutil.rmtree(target / "decode", ignore_errors=True)
    demo = AutoConfig.from_pretrained(target / "lm")
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=demo.vocab_size, n_positions=demo.n_positions,
                        bos_token_id=demo.bos_token_id, eos_token_id=demo.eos_token_id)  # fmt: skip
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    for weights in (target / "lm").glob("*.safetensors"):
        weights.unlink()
    model.save_pretrained(target / "lm", safe_serialization=True)
    return target


@pytest.fixture(scope="module")
def flat_dir(prepared_model_dir, tmp_path_factory):
    return variant(prepared_model_dir("generator"), tmp_path_factory.mktemp("flat") / "model", flatten)


def fp32_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir / "lm", dtype=torch.float32).eval()


def load(model_dir, wanted, **overrides):
    torch.set_num_threads(1)
    return load_handler(model_dir, "generator", {"precision": wanted, **overrides}, continuous_batching=True)


def native_bf16():
    return runtime.machine_can_run("bf16", CPU) is None


def test_the_gate_passes_the_peaked_model_and_refuses_the_flat_one_with_its_figures(peaked_dir, flat_dir):
    """The gate itself, on any CPU (bf16 computes the same numbers emulated, only slower)."""
    peaked = fp32_model(peaked_dir)
    passed = precision.decoding_gate(peaked, precision.at_precision(peaked, "bf16"), 0, "bf16")
    assert passed.passed and passed.first_difference is None and passed.differing_rows == 0
    assert 0 < passed.max_logprob_difference <= precision.MAX_LOGPROB_DIFFERENCE
    assert (passed.rows, passed.tokens) == (4, GATE_TOKENS)

    flat = fp32_model(flat_dir)
    rows = greedy_sequences(flat, 0, logprobs=True)
    best = max(item.logprob for row in rows for item in row.logprobs)
    assert best < -math.log(flat.config.vocab_size) + 0.5  # near-uniform: no chosen token is much likelier
    refused = precision.decoding_gate(flat, precision.at_precision(flat, "bf16"), 0, "bf16", reference=rows)
    assert not refused.passed and refused.differing_rows >= 1 and refused.first_difference is not None
    assert refused.summary().startswith(f"greedy bf16 tokens differ from fp32's in {refused.differing_rows} of 4")


def test_a_bf16_model_keeps_an_fp32_output_layer_sharing_the_fp32_weights(peaked_dir):
    fp32 = fp32_model(peaked_dir)
    model = precision.at_precision(fp32, "bf16")
    head = model.get_output_embeddings()
    assert isinstance(head, precision.Fp32Head) and head.weight is fp32.get_output_embeddings().weight
    assert model.transformer.h[0].mlp.c_fc.weight.dtype == torch.bfloat16
    hidden = torch.randn(2, 3, fp32.config.n_embd).to(torch.bfloat16)
    assert head(hidden).dtype == torch.float32
    assert precision.at_precision(fp32, "fp32") is fp32


def decode_all(handler, context, bodies):
    """Answers of ``bodies`` sent together to the per-step handler (chunked prefill: mixed passes)."""
    frontend = ContinuousFrontend(handler, context)
    jobs = [frontend.submit(body) for body in bodies]
    while not all(job.done for job in jobs):
        frontend.step()
    assert [job.status for job in jobs] == [200] * len(jobs)
    return [json.loads(job.body) for job in jobs]


BODIES = [
    {"prompt": "Once upon a time there was", "max_new_tokens": 16, "logprobs": 2},
    {"prompt": "Once upon a time there was a small model", "max_new_tokens": 12, "logprobs": 0},
    {"prompt": "Hello", "max_new_tokens": 10, "temperature": 0.8, "seed": 7},
    {"prompt": "Answer in JSON", "max_new_tokens": 24, "response_format": {"type": "json_object"}},
]


def test_auto_serves_the_peaked_model_in_bf16_with_fp32s_greedy_tokens_where_the_cpu_has_native_bf16(peaked_dir):
    handler, context = load(peaked_dir, "auto", prefill_chunk_tokens=3)
    described = handler.describe()
    if not native_bf16():  # an AVX2 CPU (or TS_CPU_AS=avx2): auto is fp32 before any gate
        assert (handler.precision, described["precision_gate"], described["backend_fallbacks"]) == ("fp32", None, [])
        assert described["precision_reason"].endswith(NO_NATIVE_BF16)
        return
    gate = described["precision_gate"]
    assert handler.precision == "bf16" and gate["passed"] and gate["first_difference"] is None
    assert 0 < gate["max_logprob_difference"] <= gate["logprob_threshold"] == precision.MAX_LOGPROB_DIFFERENCE
    assert described["precision_reason"].startswith("bf16 passed the decoding gate: greedy bf16 tokens equal fp32's")
    assert next(handler.loaded.model.parameters()).dtype == torch.bfloat16

    reference, reference_context = load(peaked_dir, "fp32", prefill_chunk_tokens=3)
    got, want = decode_all(handler, context, BODIES), decode_all(reference, reference_context, BODIES)
    for answer, expected in zip(got[:2], want[:2], strict=True):  # greedy: fp32's tokens, logprobs close to its
        assert [t["token_id"] for t in answer["logprobs"]] == [t["token_id"] for t in expected["logprobs"]]
        for mine, theirs in zip(answer["logprobs"], expected["logprobs"], strict=True):
            assert math.isfinite(mine["logprob"]) and abs(mine["logprob"] - theirs["logprob"]) < 0.1
            assert len(mine["top"]) == len(theirs["top"])
    assert got[2]["completion_tokens"] == 10 and got[2]["seed"] == 7  # sampled from fp32 logits of a bf16 model
    json.loads(got[3]["text"])  # the structured output's masks apply to its logits as to fp32's


def assert_answers_match(served, reference):
    """BODIES answered by ``served`` (handler, context) give ``reference``'s greedy tokens, with log probabilities
    within the gate's threshold, and the other requests finish as asked."""
    got, want = decode_all(*served, BODIES), decode_all(*reference, BODIES)
    for answer, expected in zip(got[:2], want[:2], strict=True):
        assert [t["token_id"] for t in answer["logprobs"]] == [t["token_id"] for t in expected["logprobs"]]
        for mine, theirs in zip(answer["logprobs"], expected["logprobs"], strict=True):
            assert abs(mine["logprob"] - theirs["logprob"]) < precision.MAX_LOGPROB_DIFFERENCE
    assert got[2]["completion_tokens"] == 10 and got[3]["finish_reason"] in ("stop", "length")


def test_the_paged_step_decodes_in_bf16_behind_its_own_gate_with_fp32s_greedy_tokens(peaked_dir, echo_dir):
    """The paged step (handler.decode_step openvino, the default) walks handler.precision too, gated on its own
    decoding: its bf16 keeps keys and values in bf16 as well, so it may refuse a model eager bf16 passes."""
    handler, context = load(echo_dir, "auto", prefill_chunk_tokens=3)
    step = handler.describe()["decode_step"]
    if not native_bf16():  # auto is fp32 here: the paged step is not offered bf16 at all
        assert (step["serving"], step["precision"], "refused" in step) == ("openvino", "fp32", False)
        return
    assert (step["serving"], step["precision"], step["output_layer"]) == ("openvino", "bf16", "fp32, compiled apart")
    assert step["gate"]["passed"] and 0 < step["gate"]["max_logprob_difference"] <= precision.MAX_LOGPROB_DIFFERENCE
    assert step["reason"].startswith("passed the decoding gate: greedy bf16 tokens equal fp32's")
    reference, reference_context = load(echo_dir, "fp32", prefill_chunk_tokens=3)
    assert reference.describe()["decode_step"]["precision"] == "fp32"
    assert_answers_match((handler, context), (reference, reference_context))

    # Where the bf16 paged step's own gate refuses (it may, where eager bf16 passes), it is listed and fp32 serves.
    step = load(peaked_dir, "auto")[0].describe()["decode_step"]
    refusals = {entry["precision"]: entry["reason"] for entry in step.get("refused", [])}
    assert step["precision"] == ("fp32" if "bf16" in refusals else "bf16") and step["gate"]["passed"]
    assert all(reason.startswith("decoding gate: greedy bf16 tokens differ") for reason in refusals.values())


def emulated_kind():
    """TS_CPU_AS runs this process as a smaller kind of CPU than the machine is."""
    wanted = cpu.requested_kind()
    return wanted is not None and wanted.name != cpu.kind_of(cpu.machine_flags())


def amplify(model):
    # Decoder matrices 20 times larger: each one's int8 rounding error grows with them, to whole nats of logits.
    for name, parameter in model.named_parameters():
        if parameter.dim() == 2 and not name.startswith(("transformer.wte", "transformer.wpe", "lm_head")):
            parameter.mul_(20.0)


def test_int8_weights_serve_where_asked_behind_the_gate_with_fp32s_greedy_tokens(
    echo_dir, prepared_model_dir, tmp_path
):
    """handler.decode_weights int8: the paged step's decoder matrices in int8, gated like bf16; auto (the default)
    leaves them untried in an archive without a package-time build, and says so. On any CPU kind: int8 weights
    need no bf16."""
    handler, context = load(echo_dir, "fp32", decode_weights="int8", prefill_chunk_tokens=3)
    step = handler.describe()["decode_step"]
    if emulated_kind() and step["precision"] != "int8":
        # OpenVINO 2026.4's int8 matmuls fail under oneDNN's ISA cap on a larger CPU (TS_CPU_AS=avx2 on AVX-512):
        # the step fails on the gate prompts, is refused for it, and fp32 serves
        assert step["refused"][0]["kind"] == "run" and step["precision"] == "fp32", step
        return
    assert (step["serving"], step["precision"], "refused" in step) == ("openvino", "int8", False), step["reason"]
    assert step["weights"].startswith("int8, one scale per output channel") and step["gate"]["passed"]
    reference, reference_context = load(echo_dir, "fp32", prefill_chunk_tokens=3)  # decode_weights auto
    shown = reference.describe()["decode_step"]
    assert (shown["precision"], shown["weights"]) == ("fp32", "as the model's")
    assert "the archive has no package-time build" in shown["untried"]["int8"]
    assert_answers_match((handler, context), (reference, reference_context))

    # A model whose int8 rounding moves its numbers: refused by the gate, with its figures, and fp32 serves.
    loud = variant(prepared_model_dir("generator"), tmp_path / "model", amplify)
    step = load(loud, "fp32", decode_weights="int8")[0].describe()["decode_step"]
    assert (step["serving"], step["precision"]) == ("openvino", "fp32"), step["reason"]
    assert [entry["precision"] for entry in step["refused"]] == ["int8"]
    assert step["refused"][0]["reason"].startswith("decoding gate: greedy int8 tokens"), step["refused"]


def test_the_flat_model_is_refused_bf16_and_serves_fp32_with_the_gates_figures(flat_dir):
    handler, _ = load(flat_dir, "bf16")
    described = handler.describe()
    assert handler.precision == "fp32" and handler.gate_rejected == ("bf16" if native_bf16() else None)
    [refused] = described["backend_fallbacks"]
    assert described["precision_reason"] == f"bf16 refused: {refused['reason']}"
    if not native_bf16():
        assert refused["reason"] == NO_NATIVE_BF16 and described["precision_gate"] is None
        step = described["decode_step"]
        refusal = {"precision": "bf16", "kind": "machine", "reason": NO_NATIVE_BF16}
        assert step["precision"] == "fp32" and step["refused"] == [refusal]
        return
    # The cosine of its next-token logits to fp32's passes; its greedy tokens do not.
    assert refused["reason"].startswith("accuracy gate: greedy bf16 tokens differ from fp32's in ")
    gate = described["precision_gate"]
    assert gate["passed"] is False and gate["differing_rows"] >= 1 and len(gate["first_difference"]) == 2
    assert next(handler.loaded.model.parameters()).dtype == torch.float32
    # The bf16 paged step is refused by its own decoding gate; the fp32 paged step serves.
    step = described["decode_step"]
    assert (step["serving"], step["precision"], step["gate"]["passed"]) == ("openvino", "fp32", True)
    [paged_refusal] = step["refused"]
    assert paged_refusal["precision"] == "bf16"
    assert paged_refusal["reason"].startswith("decoding gate: greedy bf16 tokens differ from fp32's in ")


def test_as_an_avx2_cpu_auto_resolves_to_fp32_and_bf16_is_refused_for_the_cpu(peaked_dir, monkeypatch):
    monkeypatch.setenv(cpu.CPU_KIND_ENV, "avx2")
    if reason := cpu.why_not(cpu.CPU_KINDS["avx2"]):
        pytest.skip(reason)
    handler, _ = load(peaked_dir, "auto")
    described = handler.describe()
    assert (handler.precision, described["cpu_kind"], described["backend_fallbacks"]) == ("fp32", "avx2", [])
    reason = f"handler.precision auto resolves to fp32 on this avx2 CPU: {NO_NATIVE_BF16}"
    assert described["precision_reason"] == reason
    assert described["precision_gate"] is None

    handler, _ = load(peaked_dir, "bf16")
    assert handler.precision == "fp32"
    refused = {"backend": "eager", "precision": "bf16", "reason": NO_NATIVE_BF16}
    assert handler.describe()["backend_fallbacks"] == [refused]
