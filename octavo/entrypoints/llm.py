"""The offline Python API: ``LLM(model).generate(prompts, SamplingParams)``,
and for pooling models ``embed``, ``classify`` and ``score`` (vLLM's names).

Every prompt is validated before any is scheduled, so a bad prompt in a
batch raises without leaving the others half-done.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from octavo.core.gc_heap import freeze_startup_heap
from octavo.core.lora_request import LoRARequest
from octavo.core.outputs import PoolingOutput, PoolingRequestOutput, RequestOutput
from octavo.core.pooling_batch import PoolingBatch
from octavo.core.pooling_params import PoolingParams, check_pooling_params
from octavo.core.sampling_params import RequestOutputKind, SamplingParams
from octavo.core.tokenizer import encodes_in_python
from octavo.engine_args import EngineArgs, build_engine
from octavo.entrypoints.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams
from octavo.entrypoints.pooling_inputs import (
    PoolingColumns,
    PoolingInput,
    encode_text_columns,
    plan_scores,
    score_pairs,
    token_inputs,
    truncation_length,
)
from octavo.entrypoints.pooling_stream import StreamedInputs, stream_chunk
from octavo.errors import EngineDeadError, InvalidArgumentError
from octavo.models.generation_defaults import engine_sampling_defaults
from octavo.multimodal.chat_images import conversation_images
from octavo.multimodal.processor import with_image_features

PromptType = str | list[int] | dict[str, Any]


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value) and bool(value)


def normalize_prompts(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
    if isinstance(prompts, (str, dict)) or _is_token_ids(prompts):
        return [prompts]
    if isinstance(prompts, (list, tuple)):
        return list(prompts)
    raise InvalidArgumentError(f"prompts must be a string, token ids, or a list of them; got {type(prompts).__name__}")


def per_prompt(value: Any, single: type, count: int, what: str, param: str) -> list:
    """``value`` for each of ``count`` prompts: one (or None) for all, or a sequence of one each."""
    if value is None or isinstance(value, single):
        return [value] * count
    values = list(value)
    if len(values) != count:
        raise InvalidArgumentError(f"got {len(values)} {what} for {count} prompts", param=param)
    return values


class LLM:
    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        unknown = set(kwargs) - EngineArgs.field_names()
        if unknown:
            raise InvalidArgumentError(f"unknown LLM option(s): {', '.join(sorted(unknown))}")
        self.engine = build_engine(EngineArgs(model=model, **kwargs))
        self._next_id = 0
        # The startup heap out of the full collections each batch's garbage
        # would otherwise set off (``gc_heap``).
        freeze_startup_heap()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def reset_prefix_cache(self) -> bool:
        """vLLM's: forget every cached prefix (between benchmark runs, say); False while requests run."""
        return self.engine.reset_prefix_cache()

    def reload_weights(self, weights_path: str | None = None) -> int:
        """Copy new weights into the running model in place, between requests
        (RL loops): a checkpoint directory or Hub id of the same architecture
        and shapes, or the model's own directory re-read; then forget the
        cached prefixes. Returns how many tensors were read."""
        from octavo.entrypoints.weight_updates import reload_weights

        return reload_weights(self.engine, weights_path)[0]

    def load_weights(self, weights) -> int:
        """Copy ``(checkpoint name, tensor)`` pairs (a state dict's items, any
        subset) into the running model, one worker process only."""
        from octavo.entrypoints.weight_updates import load_weights

        return load_weights(self.engine, weights)

    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list:
        """vLLM's: a method run by every worker, each one's result. Octavo's
        workers take ``reload_weights`` (optionally a checkpoint path) this way."""
        if method != "reload_weights":
            raise InvalidArgumentError(f"collective_rpc runs 'reload_weights' only, not {method!r}", param="method")
        from octavo.entrypoints.weight_updates import reload_weights

        path = (kwargs or {}).get("weights_path", args[0] if args else None)
        return reload_weights(self.engine, path)

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """vLLM's ``LLM.generate``; ``lora_request``: one adapter for every prompt, or one (or None) per prompt."""
        prompt_list = normalize_prompts(prompts)
        params_list = self._params_list(sampling_params, len(prompt_list))
        lora_list = per_prompt(lora_request, LoRARequest, len(prompt_list), "LoRARequest", "lora_request")
        for params in params_list:
            # A constraint that does not compile is refused before anything is queued.
            self.engine.check_structured_outputs(params)
        request_ids = []
        try:
            for prompt, params, lora in zip(prompt_list, params_list, lora_list):
                params = params.clone()
                params.output_kind = RequestOutputKind.FINAL_ONLY
                prompt = with_image_features(self.engine, prompt)
                request_ids.append(self.engine.add_request(self._new_id(), prompt, params, lora_request=lora))
        except BaseException:
            self.engine.abort_request(request_ids)
            raise
        return self._run(request_ids, use_tqdm)

    def beam_search(
        self, prompts: PromptType | Sequence[PromptType], params: BeamSearchParams, use_tqdm: bool = False
    ) -> list[BeamSearchOutput]:
        """vLLM's ``LLM.beam_search``: each prompt's best ``beam_width`` sequences (``beam_search.py``)."""
        params.check_limits(self.engine.limits.max_logprobs)
        processed = [with_image_features(self.engine, prompt) for prompt in normalize_prompts(prompts)]
        searches = [BeamSearch(self._prompt_ids(prompt), params, self.engine.limits.eos_token_ids) for prompt in processed]
        # Each beam extends its prompt, so the prompt's images keep their spans in every beam.
        images = [p.get("image_features") if isinstance(p, dict) else None for p in processed]
        max_model_len = self.engine.limits.max_model_len
        for search in searches:
            num_prompt_tokens = search.beams[0].num_prompt_tokens
            if num_prompt_tokens + params.max_tokens > max_model_len:
                raise InvalidArgumentError(
                    f"{num_prompt_tokens} prompt tokens plus max_tokens={params.max_tokens} exceed max_model_len "
                    f"{max_model_len}", param="max_tokens")
        step_params = searches[0].step_params() if searches else None
        while any(not search.done for search in searches):
            live = [(search, image) for search, image in zip(searches, images) if not search.done]
            step = [{"prompt_token_ids": p, "image_features": image} if image else p for s, image in live for p in s.prompts()]
            outputs = iter(self.generate(step, step_params, use_tqdm))
            for search, _ in live:
                search.advance([next(outputs).outputs[0] for _ in search.beams])
        decode = self._decoder()
        return [search.result(decode) for search in searches]

    def _prompt_ids(self, prompt: PromptType) -> list[int]:
        if isinstance(prompt, dict):
            prompt = prompt.get("prompt_token_ids") or prompt.get("prompt")
        if isinstance(prompt, str):
            if self.engine.tokenizer is None:
                raise InvalidArgumentError("a text prompt needs a tokenizer; send token ids", param="prompts")
            return list(self.engine.tokenizer.encode(prompt))
        if not _is_token_ids(prompt):
            raise InvalidArgumentError("a beam search prompt is text or token ids", param="prompts")
        return list(prompt)

    def _decoder(self):
        tokenizer = self.engine.tokenizer
        return None if tokenizer is None else lambda ids: tokenizer.decode(ids, skip_special_tokens=True)

    def chat(
        self,
        messages: list[dict[str, str]] | list[list[dict[str, str]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        use_tqdm: bool = False,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        **template_options: Any,
    ) -> list[RequestOutput]:
        """vLLM's ``LLM.chat``; ``template_options`` are ``render_chat``'s keyword options."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [self.render_chat(c, chat_template, add_generation_prompt, **template_options) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm, lora_request)

    def render_chat(
        self, conversation, chat_template=None, add_generation_prompt=True, *, continue_final_message: bool = False,
        tools: list[dict] | None = None, documents: list[dict] | None = None, chat_template_kwargs: dict | None = None,
    ) -> dict[str, Any]:
        """The prompt of a conversation: ``continue_final_message`` continues the last message instead of
        opening a turn; ``tools``, ``documents`` and ``chat_template_kwargs`` reach the template."""
        from octavo.entrypoints.openai.conversation import template_kwargs

        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise InvalidArgumentError("chat needs a tokenizer")
        if chat_template is None and not getattr(tokenizer, "chat_template", None):
            raise InvalidArgumentError("the tokenizer has no chat template; pass chat_template=...")
        if add_generation_prompt and continue_final_message:
            raise InvalidArgumentError(
                "add_generation_prompt and continue_final_message exclude each other", param="continue_final_message")
        conversation, images = conversation_images(conversation, self.engine.image_prompts is not None)
        text = tokenizer.apply_chat_template(
            conversation, chat_template=chat_template, tokenize=False, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, tools=tools, documents=documents,
            **template_kwargs(chat_template_kwargs),
        )
        # The template already holds any BOS it wants.
        prompt = {"prompt": text, "prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)}
        return {**prompt, "multi_modal_data": {"image": images}} if images else prompt

    # ---------------------------------------------------------------- pooling

    def embed(
        self, prompts, pooling_params: PoolingParams | None = None, *, truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = False,
    ) -> list[PoolingRequestOutput]:
        """One embedding per prompt (``output.outputs.embedding``)."""
        params = pooling_params or PoolingParams(task="embed")
        return self._pool_prompts(prompts, params, truncate_prompt_tokens, use_tqdm)

    def classify(
        self, prompts, pooling_params: PoolingParams | None = None, *, truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = False,
    ) -> list[PoolingRequestOutput]:
        """The classifier's scores per prompt (``output.outputs.probs``)."""
        params = pooling_params or PoolingParams(task="classify")
        return self._pool_prompts(prompts, params, truncate_prompt_tokens, use_tqdm)

    def score(
        self,
        text_1: str | Sequence[str],
        text_2: str | Sequence[str],
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = False,
    ) -> list[PoolingRequestOutput]:
        """One score per (text_1, text_2) pair (``output.outputs.score``): a
        cross-encoder's, or the cosine similarity of an embedding model's vectors."""
        limits = self.engine.limits
        truncate = truncation_length(truncate_prompt_tokens, limits.max_model_len)
        plan = plan_scores(self.engine.tokenizer, limits.pooler, score_pairs(text_1, text_2), truncate)
        outputs = self._pool(plan.inputs, PoolingParams(task=plan.task), use_tqdm)
        scores = plan.scores([output.outputs.data for output in outputs])
        return [
            PoolingRequestOutput(self._new_id(), f"{a}\n{b}", plan.pair_token_ids(i), PoolingOutput.from_values([score]))
            for i, ((a, b), score) in enumerate(zip(plan.pairs, scores))
        ]

    def _pool_prompts(self, prompts, params: PoolingParams, truncate_prompt_tokens: int | None, use_tqdm: bool):
        """Many strings are tokenized a step's worth at a time beside the
        engine's steps (``pooling_stream``); anything else all at once."""
        limits, tokenizer = self.engine.limits, self.engine.tokenizer
        check_pooling_params(params, limits.pooler)  # the task, before anything else (as ``_pooling_inputs``)
        prompt_list = normalize_prompts(prompts)
        chunk = stream_chunk(self.engine, len(prompt_list))
        if chunk is None or not all(type(p) is str for p in prompt_list):
            return self._pool(self._pooling_inputs(prompt_list, params, truncate_prompt_tokens), params, use_tqdm)
        # What ``_pooling_inputs`` and ``encode_text_columns`` refuse before tokenizing, refused before any work.
        truncate = truncation_length(truncate_prompt_tokens, limits.max_model_len)
        if tokenizer is None:
            raise InvalidArgumentError("this engine has no tokenizer; send token ids", param="input")
        # ``encode_text_columns`` looked up when called: benchmarks/embed_host.py times it.
        feed = StreamedInputs(
            prompt_list, chunk, lambda texts: encode_text_columns(tokenizer, limits.pooler, texts, truncate=truncate),
            lambda columns: self._queue_pooling(columns, params), background=not encodes_in_python(tokenizer),
        )
        if self._pools_directly():
            try:
                return self._pool_directly(feed.chunks(), params, use_tqdm, len(prompt_list))
            finally:
                feed.close()
        return self._checked(self._run([], use_tqdm, feed, len(prompt_list)))

    def _pooling_inputs(self, prompts, params: PoolingParams, truncate_prompt_tokens: int | None) -> PoolingColumns:
        """Strings tokenized in one batch; token-id prompts taken as they are."""
        limits = self.engine.limits
        check_pooling_params(params, limits.pooler)  # the task, before any tokenizing
        truncate = truncation_length(truncate_prompt_tokens, limits.max_model_len)
        prompt_list = [
            p.get("prompt") if isinstance(p, dict) and "prompt_token_ids" not in p else p for p in normalize_prompts(prompts)
        ]
        if prompt_list and all(type(p) is str for p in prompt_list):  # the usual batch of sentences: one call, no merging
            return encode_text_columns(self.engine.tokenizer, limits.pooler, prompt_list, truncate=truncate)
        texts = {i: p for i, p in enumerate(prompt_list) if isinstance(p, str)}
        encoded = {}
        if texts:
            columns = encode_text_columns(self.engine.tokenizer, limits.pooler, list(texts.values()), truncate=truncate)
            encoded = dict(zip(texts, columns.inputs()))
        inputs = []
        for i, prompt in enumerate(prompt_list):
            if i not in encoded:
                encoded[i] = token_inputs([self.engine.tokenize_prompt(prompt)[1]], truncate, self.engine.tokenizer)[0]
            inputs.append(encoded[i])
        return PoolingColumns.of(inputs)

    def _pool(
        self, inputs: PoolingColumns | list[PoolingInput], params: PoolingParams, use_tqdm: bool
    ) -> list[PoolingRequestOutput]:
        columns = inputs if isinstance(inputs, PoolingColumns) else PoolingColumns.of(inputs)
        if self._pools_directly():
            return self._pool_directly([columns], params, use_tqdm, len(columns))
        return self._checked(self._run(self._queue_pooling(columns, params), use_tqdm))

    def _pools_directly(self) -> bool:
        """Whether the engine steps a pooling call itself now (``core/pooling_lane.py``)."""
        pools_directly = getattr(self.engine, "pools_directly", None)
        return pools_directly is not None and pools_directly()

    def _pool_directly(
        self, chunks: Iterable[PoolingColumns], params: PoolingParams, use_tqdm: bool, total: int
    ) -> list[PoolingRequestOutput]:
        """The outputs of ``chunks`` in order, through the engine's pooling lane."""
        progress = None
        if use_tqdm:
            from tqdm.auto import tqdm

            progress = tqdm(total=total, desc="Processed prompts", unit="prompt")
        try:
            batches = (self._pooling_batch(columns) for columns in chunks)
            return self._checked(self.engine.pool_batches(batches, params, progress.update if progress else None))
        finally:
            if progress is not None:
                progress.close()

    def _pooling_batch(self, columns: PoolingColumns) -> PoolingBatch:
        """The engine's batch of ``columns``, under new request ids. The columns
        were made for this call: their lists go to the engine as they are. An
        input with its text was tokenized here, by the engine's tokenizer."""
        return PoolingBatch(self._new_ids(len(columns)), columns.texts, columns.token_ids, columns.token_type_ids,
                            from_tokenizer=None not in columns.texts)

    @staticmethod
    def _checked(outputs: list) -> list[PoolingRequestOutput]:
        # A replica that refused a request reports a failed RequestOutput.
        failed = [o.request_id for o in outputs if isinstance(o, RequestOutput) or o.outputs is None]
        if failed:
            raise EngineDeadError(f"the engine could not compute request {failed[0]}")
        return outputs

    def _queue_pooling(self, columns: PoolingColumns, params: PoolingParams) -> list[str]:
        """Queue the inputs as one batch where the engine can (``pooling_batch``), else one by one."""
        add_batch = getattr(self.engine, "add_pooling_requests", None)
        if add_batch is not None:
            batch = self._pooling_batch(columns)
            add_batch(batch, params)
            return batch.request_ids
        request_ids = []
        try:
            for item in columns.inputs():
                request_ids.append(self.engine.add_request(self._new_id(), item.as_engine_prompt(), params))
        except BaseException:
            self.engine.abort_request(request_ids)
            raise
        return request_ids

    def _params_list(self, sampling_params, num_prompts: int) -> list[SamplingParams]:
        if sampling_params is None:
            # The model's generation-config defaults (--generation-config), as vLLM does.
            return [SamplingParams(**engine_sampling_defaults(self.engine))] * num_prompts
        return per_prompt(sampling_params, SamplingParams, num_prompts, "SamplingParams", "sampling_params")

    def _new_id(self) -> str:
        self._next_id += 1
        return f"llm-{self._next_id}"

    def _new_ids(self, count: int) -> list[str]:
        first, self._next_id = self._next_id + 1, self._next_id + count
        return [f"llm-{i}" for i in range(first, first + count)]

    def _run(self, request_ids: list[str], use_tqdm: bool, feed: StreamedInputs | None = None, total: int = 0) -> list:
        """Step until every request is done; ``feed`` adds requests (to
        ``request_ids``) before each step, ``total`` of them in the end."""
        finished: dict[str, RequestOutput | PoolingRequestOutput] = {}
        progress = None
        if use_tqdm:
            from tqdm.auto import tqdm

            progress = tqdm(total=max(total, len(request_ids)), desc="Processed prompts", unit="prompt")
        try:
            while True:
                if feed is not None:
                    feed.top_up(request_ids, len(request_ids) - len(finished))
                if not self.engine.has_unfinished_requests():
                    break
                for output in self.engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        if progress is not None:
                            progress.update(1)
        except BaseException:
            self.engine.abort_request([r for r in request_ids if r not in finished])
            raise
        finally:
            if feed is not None:
                feed.close()
            if progress is not None:
                progress.close()
        return [finished[r] for r in request_ids]
