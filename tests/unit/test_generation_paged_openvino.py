"""handlers.generation.paged_openvino: the model converted to OpenVINO paged attention, its block pool, and the batch
that runs on it, compared with the eager batch on tiny random models built here (no expected text is hard-coded:
every assertion compares the paged step with eager torch, or a pool's state before and after)."""

import pytest
import torch

from handlers.generation import paged_openvino, precision
from handlers.generation.decoding import SamplingSettings, Sequence
from handlers.generation.gate import greedy_tokens
from handlers.generation.prefix_cache import PrefixCache
from handlers.generation.running import generate

PROMPTS = [[5, 17, 42, 7, 99, 3, 250, 11], [8, 9], list(range(300, 334))]  # 8, 2 and 34 tokens (a 2nd block)


def tiny(kind):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if kind == "gpt2":
        return GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=500, n_positions=256)).eval()
    config = LlamaConfig(vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
    return LlamaForCausalLM(config).eval()  # grouped-query attention, rotary positions


def gate(model):
    """The handler's gate: greedy decoding of the gate prompts on the paged step against the eager fp32 model's."""
    return lambda paged, wanted: precision.decoding_gate(model, model, 0, wanted, paged=paged)


def select(model, setting="openvino", pool=(4096, 16), precisions=("fp32",)):
    return paged_openvino.select(model, setting, 1, pool, list(precisions), gate(model))


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def served(request):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = tiny(request.param)
    outcome = select(model)
    yield model, outcome
    torch.set_num_threads(threads)


def decode(model, prompts, settings, paged=None, prefix_cache=None):
    sequences = [Sequence(list(prompt), setting) for prompt, setting in zip(prompts, settings, strict=True)]
    with torch.inference_mode():
        generate(model, sequences, (), 0, prefix_cache=prefix_cache, paged=paged)
    return sequences


def test_the_model_converts_passes_the_gate_and_describe_says_what_serves(served):
    model, outcome = served
    assert outcome.serving == "openvino" and outcome.paged is not None, outcome.reason
    shown = outcome.describe()
    assert shown["setting"] == "openvino" and shown["precision"] == "fp32" and shown["output_layer"] == "compiled"
    assert shown["reason"].startswith("passed the decoding gate: greedy fp32 tokens equal fp32's")
    assert shown["gate"]["passed"] and shown["gate"]["max_logprob_difference"] < 1e-3
    assert shown["block_size"] >= 1 and shown["free_blocks"] == shown["blocks"]  # the gate gave its blocks back
    assert greedy_tokens(model, 0, paged=outcome.paged) == greedy_tokens(model, 0)


def test_rows_of_different_lengths_get_eagers_tokens_and_every_block_comes_back(served):
    model, outcome = served
    settings = [SamplingSettings(10), SamplingSettings(7, 0.9, seed=3), SamplingSettings(12, 1.1, top_k=20, seed=5)]
    eager = decode(model, PROMPTS, settings)
    paged = decode(model, PROMPTS, settings, paged=outcome.paged)
    assert [s.token_ids for s in paged] == [s.token_ids for s in eager]
    assert outcome.paged.free_blocks == outcome.paged.blocks


def test_rows_joining_and_leaving_a_running_paged_batch_compute_what_they_would_alone(served):
    model, outcome = served
    batch = paged_openvino.PagedBatch(outcome.paged, (), chunk_tokens=4)
    first = Sequence(list(PROMPTS[0]), SamplingSettings(15))
    with torch.inference_mode():
        batch.prefill([first])
        for _ in range(3):
            batch.step()
        later = Sequence(list(PROMPTS[2]), SamplingSettings(6, 0.8, seed=11))
        batch.begin_filling([later])  # chunked: 4 prompt tokens a pass, riding in the running row's steps
        while batch.filling is not None:
            batch.advance()
        while batch.rows:
            batch.step()
            batch.remove_finished()
    alone = [decode(model, [s.prompt_ids], [s.settings])[0] for s in (first, later)]
    assert [first.token_ids, later.token_ids] == [s.token_ids for s in alone]
    assert outcome.paged.free_blocks == outcome.paged.blocks


def test_n_choices_of_one_prompt_share_its_computation_and_each_samples_its_own_tokens(served):
    model, outcome = served
    settings = [SamplingSettings(8, 1.0, seed=seed) for seed in (1, 2, 3)]
    together = decode(model, [PROMPTS[0]] * 3, settings, paged=outcome.paged)
    alone = [decode(model, [PROMPTS[0]], [setting])[0] for setting in settings]
    assert [s.token_ids for s in together] == [s.token_ids for s in alone]
    assert len({tuple(s.token_ids) for s in together}) > 1  # copied rows, not one row read three times


def test_prefix_cache_blocks_from_the_paged_step_equal_eagers_and_are_reused(served):
    model, outcome = served
    long_prompt = list(range(40, 80))  # 40 tokens: two whole 16-token blocks to keep
    eager_cache, paged_cache = (PrefixCache(10**8, identity="test") for _ in range(2))
    decode(model, [long_prompt], [SamplingSettings(2)], prefix_cache=eager_cache)
    decode(model, [long_prompt], [SamplingSettings(2)], paged=outcome.paged, prefix_cache=paged_cache)
    eager_hit, paged_hit = eager_cache.lookup(long_prompt + [1]), paged_cache.lookup(long_prompt + [1])
    assert paged_hit.length == eager_hit.length == 32
    for (ek, ev), (pk, pv) in zip(eager_hit.kv, paged_hit.kv, strict=True):
        assert pk.shape == ek.shape and torch.allclose(pk, ek, atol=1e-4) and torch.allclose(pv, ev, atol=1e-4)
    follow = long_prompt + [7, 8, 9]
    reused = decode(model, [follow], [SamplingSettings(6)], paged=outcome.paged, prefix_cache=paged_cache)[0]
    assert paged_cache.describe()["hits"] >= 2
    assert reused.token_ids == decode(model, [follow], [SamplingSettings(6)])[0].token_ids


def test_a_cancelled_row_gives_its_blocks_back_mid_prompt_and_mid_decoding(served):
    _, outcome = served
    pool = outcome.paged
    batch = paged_openvino.PagedBatch(pool, (), chunk_tokens=4)
    running = Sequence(list(PROMPTS[0]), SamplingSettings(50))
    joining = Sequence(list(PROMPTS[2]), SamplingSettings(50))
    with torch.inference_mode():
        batch.prefill([running])
        batch.begin_filling([joining])
        batch.advance()
        assert batch.filling is not None and pool.free_blocks < pool.blocks
        batch.remove([joining])  # cancelled while its prompt is being computed
        assert batch.filling is None
        batch.step()
        batch.remove([running])
    assert batch.rows == 0 and pool.free_blocks == pool.blocks


def test_a_prompt_token_the_model_does_not_embed_ends_that_request_only(served):
    model, outcome = served
    vocab = outcome.paged.vocab
    good, bad = Sequence(list(PROMPTS[0]), SamplingSettings(5)), Sequence([1, vocab + 7, 2], SamplingSettings(5))
    with torch.inference_mode():
        generate(model, [good, bad], (), 0, paged=outcome.paged)
    assert bad.finish_reason == "error" and f"prompt token id {vocab + 7} is outside" in bad.error
    assert bad.token_ids == [] and good.token_ids == decode(model, [PROMPTS[0]], [SamplingSettings(5)])[0].token_ids
    assert outcome.paged.free_blocks == outcome.paged.blocks


def test_a_full_pool_refuses_the_pass_and_leaves_the_rows_as_they_were(served):
    _, outcome = served
    pool = outcome.paged
    taken = paged_openvino.PagedRow()
    pool.reserve(taken, pool.free_blocks * pool.block_size)  # every block but none is left
    try:
        batch = paged_openvino.PagedBatch(pool, ())
        with pytest.raises(paged_openvino.PoolExhausted, match="block pool is full"), torch.inference_mode():
            batch.prefill([Sequence([1, 2, 3], SamplingSettings(4))])
        assert batch.rows == 0
    finally:
        pool.release(taken)
    assert pool.free_blocks == pool.blocks


def test_eager_setting_and_an_unconvertible_model_decode_eagerly_with_the_reason(monkeypatch):
    model = tiny("gpt2")
    assert select(model, "eager", (1024, 4)).describe()["serving"] == "eager"

    def refuse(model):
        raise paged_openvino.Unconvertible("the tracer refused an op")

    monkeypatch.setattr(paged_openvino, "export", refuse)
    outcome = select(model, pool=(1024, 4))
    assert outcome.serving == "eager" and outcome.paged is None
    assert "does not convert" in outcome.reason and "the tracer refused an op" in outcome.reason


def native_bf16():
    from handlers.core import runtime

    return runtime.machine_can_run("bf16", torch.device("cpu")) is None


def test_bf16_paged_step_keeps_an_fp32_output_layer_and_passes_the_gate_on_clear_choices():
    """A model whose greedy choices are clear (its output layer scaled 8 times) decodes on the bf16 paged step with
    eager fp32's tokens; where the CPU has no native bf16 that precision is refused for the CPU and fp32 serves."""
    model = tiny("gpt2")
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    outcome = select(model, precisions=("bf16", "fp32"))
    assert outcome.serving == "openvino", outcome.reason
    shown = outcome.describe()
    if not native_bf16():
        assert shown["precision"] == "fp32" and shown["refused"][0]["precision"] == "bf16"
        assert "native bf16" in shown["refused"][0]["reason"]
        return
    assert (shown["precision"], shown["output_layer"], "refused" in shown) == ("bf16", "fp32, compiled apart", False)
    assert 0 < shown["gate"]["max_logprob_difference"] <= precision.MAX_LOGPROB_DIFFERENCE
    settings = [SamplingSettings(10, logprobs=0)] * len(PROMPTS)
    eager, paged = decode(model, PROMPTS, settings), decode(model, PROMPTS, settings, paged=outcome.paged)
    assert [s.token_ids for s in paged] == [s.token_ids for s in eager]
    # The pool holds bf16 words; the prefix cache reads and writes fp32 tensors, rounded to bf16 and back exactly.
    pool = outcome.paged
    row = paged_openvino.PagedRow()
    pool.run([(row, PROMPTS[2], True)])
    kv = pool.read(row, 0, len(PROMPTS[2]))
    assert kv[0][0].dtype == torch.float32 and torch.equal(kv[0][0], kv[0][0].to(torch.bfloat16).float())
    copy = paged_openvino.PagedRow()
    pool.write(copy, kv)
    again = [tensor for pair in pool.read(copy, 0, len(PROMPTS[2])) for tensor in pair]
    assert all(torch.equal(a, b) for a, b in zip([t for pair in kv for t in pair], again, strict=True))
    pool.release(row)
    pool.release(copy)
    assert pool.free_blocks == pool.blocks


def weight_constants(converted):
    """The element types of the converted decoder's matmul weights: {matmul name: type}."""
    found = {}
    for op in converted.get_ordered_ops():
        if op.get_type_name() == "MatMul":
            source = op.input(1).get_source_output().get_node()
            if source.get_type_name() == "Multiply":  # int8_weights' dequantisation: Convert(int8) x scale
                source = source.input_value(0).get_node().input_value(0).get_node()
            if source.get_type_name() == "Constant":
                found[op.get_friendly_name()] = source.get_output_element_type(0).get_type_name()
    return found


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_int8_weights_make_every_decoder_matrix_int8_keep_the_output_layer_and_pass_the_gate_on_clear_choices(kind):
    """int8 weights (handler.decode_weights): every decoder matmul's weights int8 with a scale per output channel,
    the output layer's fp32, the fp32 model left as it was; a model of clear choices keeps eager fp32's tokens."""
    model = tiny(kind)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    converted, _, _ = paged_openvino.convert(model)
    before = weight_constants(converted)
    compressed, weights = paged_openvino.int8_weights(converted)
    assert weight_constants(converted) == before  # the fp32 and bf16 steps compile the model as it was
    after = weight_constants(compressed)
    output_layer = paged_openvino.logits_matmul(compressed).get_friendly_name()
    linears = [m for m in model.modules() if type(m).__name__ in ("Linear", "Conv1D") and m is not model.lm_head]
    assert after.pop(output_layer) == "f32" and sorted(set(after.values())) == ["i8"]
    assert weights.matrices == len(after) == len(linears)  # every decoder matrix, nothing else
    assert weights.int8_bytes < weights.fp32_bytes / 3.5  # a quarter, and the scales

    outcome = select(model, precisions=("int8", "fp32"))
    shown = outcome.describe()
    assert (outcome.serving, shown["precision"], "refused" in shown) == ("openvino", "int8", False), outcome.reason
    assert shown["weights"].startswith(f"int8, one scale per output channel: {len(linears)} decoder matrices")
    assert shown["gate"]["passed"] and 0 < shown["gate"]["max_logprob_difference"] <= precision.MAX_LOGPROB_DIFFERENCE
    settings = [SamplingSettings(10, logprobs=0)] * len(PROMPTS)
    eager, paged = decode(model, PROMPTS, settings), decode(model, PROMPTS, settings, paged=outcome.paged)
    assert [s.token_ids for s in paged] == [s.token_ids for s in eager]
    pairs = [pair for e, p in zip(eager, paged, strict=True) for pair in zip(e.logprobs, p.logprobs, strict=True)]
    differences = [abs(mine.logprob - theirs.logprob) for mine, theirs in pairs]
    assert 0 < max(differences) <= precision.MAX_LOGPROB_DIFFERENCE  # int8 numbers, not fp32's


def test_int8_weights_the_gate_refuses_leave_the_next_precision_serving_with_the_figures():
    """A model whose greedy choices hang on hundredths (random weights, output layer as initialised): int8's
    rounding moves its log probabilities past the threshold, and fp32 serves."""
    model = tiny("gpt2")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 2 and "wte" not in name and "wpe" not in name:
                parameter.mul_(20.0)  # large matrices: int8's rounding error is large in nats
    outcome = select(model, precisions=("int8", "fp32"))
    shown = outcome.describe()
    assert (outcome.serving, shown["precision"]) == ("openvino", "fp32"), outcome.reason
    assert [entry["precision"] for entry in shown["refused"]] == ["int8"]
    assert shown["refused"][0]["kind"] == "gate"
    assert shown["refused"][0]["reason"].startswith("decoding gate: greedy int8 tokens")


def test_a_step_that_fails_on_the_gate_prompts_is_refused_and_the_next_precision_serves():
    model = tiny("gpt2")
    checked = gate(model)

    def failing_int8(paged, wanted):
        if wanted == "int8":
            raise paged_openvino.StepFailed("the paged step computed 0 rows of logits for 3 rows")
        return checked(paged, wanted)

    outcome = paged_openvino.select(model, "openvino", 1, (1024, 4), ["int8", "fp32"], failing_int8)
    assert (outcome.serving, outcome.paged.precision) == ("openvino", "fp32")
    assert outcome.refused == [{"precision": "int8", "kind": "run", "reason": "the int8 paged step failed on the "
                                "gate prompts: the paged step computed 0 rows of logits for 3 rows"}]  # fmt: skip


def test_the_walk_order_puts_int8_weights_first_and_auto_tries_them_only_where_ranked():
    assert paged_openvino.walk_order("bf16", "auto") == (["int8", "bf16", "fp32"], {"int8"})
    assert paged_openvino.walk_order("fp32", "int8") == (["int8", "fp32"], set())
    assert paged_openvino.walk_order("bf16", "full") == (["bf16", "fp32"], set())
    model = tiny("gpt2")
    outcome = paged_openvino.select(model, "openvino", 1, (1024, 4), ["int8", "fp32"], gate(model),
                                    ranked_only={"int8"})  # fmt: skip
    shown = outcome.describe()
    assert (shown["serving"], shown["precision"], "refused" in shown) == ("openvino", "fp32", False)
    assert shown["untried"] == {"int8": "tried only where the package-time build ranked it, and the archive has no "
                                "package-time build"}  # fmt: skip


def test_each_refused_precision_is_listed_and_a_step_no_gate_passes_decodes_eagerly(monkeypatch):
    model = tiny("gpt2")

    class Refusing:
        passed = False

        def summary(self):
            return "greedy tokens differ"

        def describe(self):
            return {"passed": False}

    outcome = paged_openvino.select(model, "openvino", 1, (1024, 4), ["fp16", "fp32"], lambda paged, p: Refusing())
    assert outcome.serving == "eager" and outcome.paged is None
    assert [entry["precision"] for entry in outcome.refused] == ["fp16", "fp32"]
    assert outcome.refused[0]["reason"] == "the paged step computes fp32, bf16, int8"
    assert outcome.refused[1]["reason"] == "decoding gate: greedy tokens differ"
    assert outcome.reason == "fp16: the paged step computes fp32, bf16, int8; fp32: decoding gate: greedy tokens differ"
