"""Handler for ``generator``: text generation with a Hugging Face causal LM, KV cache, optional streaming.

Request ``{"prompt": "...", "max_new_tokens": n, "temperature": t, "top_k": k, "seed": s, "stream": bool}``
(validated by :mod:`handlers.generation_requests`) -> ``{"text", "finish_reason", "prompt_tokens",
"completion_tokens", "model": {"name", "weights"}}`` (+ ``"seed"`` when sampling). With ``"stream": true`` the answer
is newline-delimited JSON sent as the tokens are produced: ``{"text": piece, "done": false}`` lines, then one
``{"text": rest, "done": true, ...counts...}`` line; the pieces concatenate to the non-streamed text.

All accepted requests of a batch decode together (:func:`handlers.decoding.generate`): one prefill over the
left-padded prompts, then one cached step per token; a finished request leaves the batch, and each request samples
with its own seeded generator, so its tokens do not depend on its batch-mates. Streamed pieces go out as TorchServe
intermediate responses addressed to the streaming requests only (:mod:`handlers.streaming`).

The model folder inside the archive is any Hugging Face causal-LM directory (config, safetensors weights, tokenizer);
the archive's ``model_info.json`` names it and says where its weights come from (the demo's are random).
"""

import json
import logging
import os
import time

import torch

from handlers.base import ServingHandler, json_body
from handlers.config import COMMON_OPTIONS, ConfigError, Option
from handlers.decoding import FINISH_ERROR, Sequence, generate
from handlers.errors import RequestError, ServerError
from handlers.generation_requests import Generation, GenerationLimits, parse_generation_request
from handlers.metrics import HandlerMetrics
from handlers.streaming import STREAM_CONTENT_TYPE, IncrementalText, ndjson, send_chunks

logger = logging.getLogger(__name__)


class GeneratorHandler(ServingHandler):
    options = {
        **COMMON_OPTIONS,
        "compile": Option(str, "none", ("none",), help="decoding runs eagerly (shapes change every step)"),
        "model_subdir": Option(str, "lm", help="the Hugging Face model folder inside the archive"),
        "info_file": Option(str, "model_info.json", help="JSON {name, weights} shown in answers (optional file)"),
        "max_prompt_tokens": Option(int, 256, minimum=1, help="longest prompt accepted, in tokens"),
        "max_new_tokens": Option(int, 128, minimum=1, help="largest max_new_tokens a request may ask for"),
        "default_max_new_tokens": Option(int, 32, minimum=1, help="max_new_tokens when a request gives none"),
        "max_temperature": Option(float, 5.0, minimum=0.0, help="largest temperature a request may ask for"),
    }

    def __init__(self):
        super().__init__()
        self.context = None
        self.streaming_indices = set()  # batch indices of accepted streaming requests (answers are NDJSON lines)
        self.chunks_sent = set()  # batch indices that have received part of their stream (cannot be recomputed)
        self.stream_sink = send_chunks  # how intermediate chunks leave; unit tests record them instead

    # ----------------------------------------------------------------------------------------------- load time
    def load_model(self, model_dir):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        path = os.path.join(model_dir, self.config["model_subdir"])
        if not os.path.isdir(path):
            raise ConfigError(f"handler.model_subdir: {path} is not a folder in the archive")
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, use_safetensors=True,
                                                     dtype=torch.float32)
        self.model_info, self.model_source = self.read_model_info(model_dir)
        self.limits = self.check_limits(model.config)
        self.stop_token_ids = stop_token_ids(getattr(model, "generation_config", None), self.tokenizer)
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else (self.stop_token_ids or [0])[0]  # masked out either way
        return model

    def read_model_info(self, model_dir):
        """({name, weights} shown in every answer, where the weights came from: shown by describe only)."""
        written = {}
        path = os.path.join(model_dir, self.config["info_file"])
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as file:
                written = json.load(file)
        info = {"name": str(written.get("name") or self.model_name), "weights": str(written.get("weights") or
                                                                              "user-supplied")}
        return info, written.get("source")

    def check_limits(self, model_config):
        config = self.config
        if config["default_max_new_tokens"] > config["max_new_tokens"]:
            raise ConfigError(f"handler.default_max_new_tokens ({config['default_max_new_tokens']}) is above "
                              f"handler.max_new_tokens ({config['max_new_tokens']})")
        positions = getattr(model_config, "n_positions", None) or getattr(model_config, "max_position_embeddings", None)
        longest = config["max_prompt_tokens"] + config["max_new_tokens"]
        if positions and longest > positions:
            raise ConfigError(f"handler.max_prompt_tokens + handler.max_new_tokens = {longest} exceeds the model's "
                              f"{positions} positions")
        # A token stands for at most its longest vocabulary entry (+1 for a space a decoder may add), so a prompt
        # longer than this cannot fit the token limit: refuse it without tokenizing megabytes.
        longest_entry = max(len(entry) for entry in self.tokenizer.get_vocab())
        return GenerationLimits(
            max_prompt_tokens=config["max_prompt_tokens"], max_new_tokens=config["max_new_tokens"],
            default_max_new_tokens=config["default_max_new_tokens"], max_temperature=config["max_temperature"],
            vocab_size=model_config.vocab_size, max_prompt_chars=(longest_entry + 1) * config["max_prompt_tokens"],
        )

    def reference_batch(self):
        # Fixed, seeded token ids: the accuracy gate compares next-token logits of reduced precision with fp32.
        generator = torch.Generator().manual_seed(1234)
        input_ids = torch.randint(0, self.limits.vocab_size, (4, 16), generator=generator)
        return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}

    def warmup_batches(self):
        shapes = {(1, 8), (self.max_batch_requests, 8)}
        return [{"input_ids": torch.zeros(rows, width, dtype=torch.long),
                 "attention_mask": torch.ones(rows, width, dtype=torch.long)} for rows, width in sorted(shapes)]

    def forward(self, model, batch):
        """Next-token logits of the last column (the gate and warm-up; decoding uses handlers.decoding)."""
        output = model(input_ids=batch["input_ids"].to(self.device),
                       attention_mask=batch["attention_mask"].to(self.device))
        return output.logits[:, -1, :]

    def describe(self):
        return {**super().describe(), "model": {**self.model_info, "source": self.model_source}, "limits": {
            "max_prompt_tokens": self.limits.max_prompt_tokens, "max_new_tokens": self.limits.max_new_tokens,
            "default_max_new_tokens": self.limits.default_max_new_tokens,
            "max_temperature": self.limits.max_temperature, "top_k_max": self.limits.vocab_size},
            "stop_token_ids": self.stop_token_ids}

    # ----------------------------------------------------------------------------------------------- per batch
    def handle(self, data, context):
        self.context = context  # inference streams chunks through it
        self.streaming_indices, self.chunks_sent = set(), set()
        try:
            responses = super().handle(data, context)
        finally:
            self.context = None
        for idx, response in enumerate(responses):
            if isinstance(response, str) and response.endswith("\n"):  # a streamed answer's last line
                context.set_response_content_type(idx, STREAM_CONTENT_TYPE)
        return responses

    def parse_request(self, body, request):
        """Validate one request (see handlers.generation_requests); returns (batch index, GenerationRequest)."""
        if body is None:
            raise RequestError("body must be a JSON object with a 'prompt' field, got null")
        return request.idx, parse_generation_request(json_body(body, request), self.limits, self.encode_prompt)

    def encode_prompt(self, prompt):
        return self.tokenizer.encode(prompt)

    def preprocess(self, payloads):
        # |=: after a failed batch its requests are retried one at a time, and each must keep its stream framing.
        self.streaming_indices |= {idx for idx, request in payloads if request.stream}
        return [Generation(idx=idx, request=request, sequence=Sequence(request.prompt_ids, request.settings),
                           text=IncrementalText(self.tokenizer, request.prompt_ids)) for idx, request in payloads]

    def inference(self, generations):
        started = time.perf_counter()
        first_token_at = []
        context = self.context

        def on_step(new_tokens):
            if not first_token_at:
                first_token_at.append(time.perf_counter())
            chunks = {}
            for index, token in new_tokens.items():
                generation = generations[index]
                generation.text.push(token)
                # A finished request's last pieces go in its final line, which closes its stream.
                if generation.request.stream and not generation.sequence.finished:
                    piece = "".join(generation.text.pieces[generation.pieces_sent:])
                    if piece:
                        chunks[generation.idx] = ndjson({"text": piece, "done": False})
                        generation.pieces_sent = len(generation.text.pieces)
            if chunks and context is not None:
                self.stream_sink(context, chunks)
                self.chunks_sent.update(chunks)

        generate(self.model, [g.sequence for g in generations], self.stop_token_ids, self.pad_token_id,
                 use_cache=True, on_step=on_step)
        metrics = HandlerMetrics(context, self.model_name)
        if first_token_at:
            metrics.record("TimeToFirstTokenSeconds", first_token_at[0] - started)
        metrics.record("GeneratedTokens", sum(len(g.sequence.token_ids) for g in generations))
        return generations

    def postprocess(self, generations, payloads):
        results = []
        for generation in generations:
            request, sequence = generation.request, generation.sequence
            if sequence.finish_reason == FINISH_ERROR:
                results.append(ServerError(f"generation stopped after {len(sequence.token_ids)} token(s): "
                                           f"{sequence.error}"))
                continue
            generation.text.finish()
            answer = {"finish_reason": sequence.finish_reason, "prompt_tokens": len(sequence.prompt_ids),
                      "completion_tokens": len(sequence.token_ids), "model": self.model_info}
            if request.seed_reported:
                answer["seed"] = request.settings.seed
            if request.stream:
                rest = "".join(generation.text.pieces[generation.pieces_sent:])
                results.append({"text": rest, "done": True, **answer})
            else:
                results.append({"text": generation.text.text, **answer})
        return results

    def serialize(self, idx, value):
        """A streamed request's answer (or error) is its stream's last NDJSON line; the others are one JSON object."""
        return ndjson(value) if idx in self.streaming_indices else super().serialize(idx, value)

    def reject(self, context, idx, error, metrics):
        """As the base; a streamed answer's error also closes its stream (``done``), which may already be open."""
        body = super().reject(context, idx, error, metrics)
        return {**body, "done": True} if idx in self.streaming_indices else body

    def can_retry_alone(self, payload):
        """A request whose stream has already sent pieces cannot be generated again without repeating them."""
        idx, _request = payload
        return idx not in self.chunks_sent


def stop_token_ids(generation_config, tokenizer):
    """The end-of-text token id(s): the generation config's (one id or a list), else the tokenizer's; may be none."""
    stop = getattr(generation_config, "eos_token_id", None)
    if stop is None:
        stop = tokenizer.eos_token_id
    if stop is None:
        return []
    return sorted(set(stop)) if isinstance(stop, (list, tuple)) else [stop]
