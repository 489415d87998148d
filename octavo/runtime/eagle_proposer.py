"""Speculative decoding with an EAGLE head (``models/eagle.py``), an EAGLE-3
head (``models/eagle3.py``) or a multi-token-prediction layer
(``models/mtp.py``), run by each worker beside the target. All read, at
position ``p``, token ``x[p+1]`` and a hidden state of the target at ``p``;
what differs is which hidden state (EAGLE-3: three layers' input streams;
EAGLE and MTP: the final one, after the target's norm) and their layers, so
one proposer runs them all (``head``).

The head keeps its KV cache in the target's blocks as a draft model does
(``DraftModel``: the same block ids and slots, tensors of its own). What
differs is what it reads: at position ``p`` the embedding of token
``x[p+1]`` and a hidden state of position ``p``. So it follows a step only
once the step's tokens are sampled (``propose``):

1. One pass over the target's batch: each row reads the next token in the
   batch, except a request's last kept row, which reads the token sampled
   after it (for a request verifying drafts, the row of its last accepted
   draft reads the bonus token; a prompt chunk's last row reads the next
   prompt token), and the target's hidden states of that position (kept by
   the target's forward, ``models/aux_hidden.py``). This writes the head's
   KV for every computed position (rows past a rejected draft are written
   again next step, as the target's are), and the last kept row's guess is
   the request's first draft.
2. Each further draft: a one-token step at the next position reading the
   draft before it and the head's own output stream of the row before.

The follow pass runs eagerly (one layer over the step's tokens); where the
platform captures the target's decode steps as graphs, the head's
one-token steps are captured too (the same graph runner): each reads its
hidden states from a persistent buffer and writes its output stream to
another. The target's hidden states come from the persistent buffer its
own replayed graphs write.
"""

from __future__ import annotations

import numpy as np
import torch

from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.errors import ModelLoadError
from octavo.models.eagle import EagleLlamaForCausalLM
from octavo.models.eagle3 import Eagle3LlamaForCausalLM
from octavo.models.layers.attention import ForwardContext
from octavo.models.llama import DecoderModel
from octavo.models.mtp import MtpHead
from octavo.runtime.config import dtype_from_name
from octavo.runtime.draft_model import DraftModel, _DraftCaptureView, collect_drafts
from octavo.runtime.input_batch import PreparedBatch


class EagleProposer(DraftModel):
    def __init__(self, runner) -> None:
        super().__init__(runner)
        self.head: Eagle3LlamaForCausalLM | MtpHead = self.loaded.model
        if runner.config.load_format == "dummy" and hasattr(self.head, "d2t"):
            self.head.d2t.data.zero_()  # random weights: head token i is target token i
        decoder = getattr(runner.loaded.model, "model", None)
        arch = runner.loaded.arch
        if not isinstance(decoder, DecoderModel) or decoder.embed_tokens is None:
            raise ModelLoadError(f"EAGLE-3 and MTP heads draft for Llama-shaped decoders; {arch.architecture} is not one")
        if self.head.target_hidden_size != arch.hidden_size or self.head.config.vocab_size != arch.vocab_size:
            raise ModelLoadError(
                f"the draft head was trained for a target of hidden size {self.head.target_hidden_size} and "
                f"{self.head.config.vocab_size} tokens; this target has {arch.hidden_size} and {arch.vocab_size}"
            )
        layers = arch.num_hidden_layers
        if getattr(self.head, "reads_final_hidden", False):
            layer_ids = (layers,)  # EAGLE-1: the stream after the target's last layer (normed by ``combine``)
        else:
            layer_ids = self.head.aux_layer_ids or (2, layers // 2, layers - 3)
        if any(not 0 <= i <= layers for i in layer_ids):
            raise ModelLoadError(
                f"the EAGLE-3 head reads the target's layers {list(layer_ids)}, but the target has {layers}; "
                "a head for this target names them in eagle_aux_hidden_state_layer_ids"
            )
        self.head.share_target_layers(decoder.embed_tokens, getattr(runner.loaded.model, "lm_head", None), decoder.norm)
        self.aux_hidden = decoder.keep_aux_hidden_states(tuple(layer_ids), runner.inputs.buffers.max_num_tokens)
        self._step: tuple[PreparedBatch, SchedulerOutput] | None = None

    def model_class(self):
        heads = {"mtp": MtpHead, "eagle": EagleLlamaForCausalLM, "eagle3": Eagle3LlamaForCausalLM}
        return heads[self.runner.config.speculative_method]

    def capture_graphs(self, factory, sizes: list[int]) -> None:
        """Capture the head's one-token steps (its follow pass stays eager)."""
        backends = self.loaded.layer_backends
        if not sizes or not all(getattr(b, "supports_graph_capture", False) for b in backends):
            return
        width, dtype = self.head.config.hidden_size, dtype_from_name(self.runner.config.dtype)
        self._hidden_in = torch.zeros(max(sizes), width, dtype=dtype, device=self.runner.device)
        self._stream_out = torch.zeros_like(self._hidden_in)
        self.graphs = factory(_DraftCaptureView(self), sizes)
        self.graphs.capture()

    def capture_prefill_graphs(self, buckets: list[int], max_num_reqs: int) -> None:
        """None: the follow pass runs eagerly."""

    def graph_step(self, input_ids, positions, attn_batch, num_reqs: int) -> torch.Tensor:
        """A one-token step on the persistent buffers, as a graph captures it:
        reads ``_hidden_in``, writes ``_stream_out``, returns the guesses."""
        normed, stream = self._forward(input_ids, positions, self._hidden_in[:num_reqs], attn_batch)
        self._stream_out[:num_reqs].copy_(stream)
        return self.head.greedy(normed)

    # ----------------------------------------------------------------- step

    def follow(self, batch: PreparedBatch, scheduler_output, graph_size: int | None, prefill_bucket: int | None) -> None:
        """Keep the step for ``propose``: the head reads the tokens sampled after it."""
        self._step = (batch, scheduler_output)

    def propose(self, output: ModelRunnerOutput) -> None:
        """Follow the step (its KV, every time), then guess each drafting request's next tokens into ``output``."""
        if self._step is None:
            return
        batch, scheduler_output = self._step
        self._step = None
        last_rows = self._last_kept_rows(scheduler_output, output)
        input_ids = torch.empty_like(batch.input_ids)
        input_ids[:-1] = batch.input_ids[1:]
        input_ids[-1:] = 0
        if last_rows:
            device = input_ids.device
            rows = torch.tensor([row for row, _ in last_rows.values()], dtype=torch.long).to(device)
            tokens = torch.tensor([token for _, token in last_rows.values()], dtype=input_ids.dtype).to(device)
            input_ids[rows] = tokens
        num_rows = batch.input_ids.shape[0]
        hidden = self.head.combine(self.aux_hidden[:num_rows])
        normed, stream = self._forward(input_ids, batch.positions, hidden, batch.attn_batch)
        if self.drafting_paused():
            return
        request_ids, positions, _, limits = self.drafting_requests(output)
        if request_ids:
            rows = torch.tensor([last_rows[r][0] for r in request_ids], dtype=torch.long).to(normed.device)
            drafts = self._decode_from(request_ids, np.asarray(positions, dtype=np.int64), limits, normed[rows], stream[rows])
            for request_id, request_drafts in zip(request_ids, drafts):
                output.draft_token_ids[request_id] = request_drafts

    def _last_kept_rows(self, scheduler_output: SchedulerOutput, output: ModelRunnerOutput) -> dict[str, tuple[int, int]]:
        """Request id -> (its last kept row in the batch, the token after it)
        for every request whose next token is known."""
        states, spec = self.runner.states, scheduler_output.spec_token_ids
        rows: dict[str, tuple[int, int]] = {}
        first = 0
        for request_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            kept = output.sampled_token_ids.get(request_id)
            state = states.get(request_id)
            if kept:  # the rows before the drafts, then one per accepted draft
                num_drafts = len(spec.get(request_id, ()))
                rows[request_id] = (first + num_tokens - 1 - num_drafts + len(kept) - 1, kept[-1])
            elif state is not None:
                end = state.num_computed_tokens + num_tokens
                if end < len(state.token_ids):  # a prompt chunk: the next prompt token
                    rows[request_id] = (first + num_tokens - 1, state.token_ids[end])
            first += num_tokens
        return rows

    def _decode_from(self, request_ids, positions: np.ndarray, limits: list[int], normed, stream) -> list[list[int]]:
        """Greedy drafts: the first from the follow pass's rows (``normed``,
        ``stream``), each further one a batched one-token step at the newest
        token's position and on; request ``j`` takes ``limits[j]``."""
        limits_arr = np.asarray(limits)
        active = np.arange(len(request_ids))
        tokens = self.head.greedy(normed)
        steps = [(active, tokens)]
        for step in range(1, int(limits_arr.max())):
            keep = np.flatnonzero(limits_arr[active] > step)
            keep_rows = torch.from_numpy(keep).to(tokens.device)
            active = active[keep]
            tokens, stream = tokens.index_select(0, keep_rows), stream.index_select(0, keep_rows)
            ids = [request_ids[j] for j in active]
            size = self.graphs.padded_size(len(ids)) if self.graphs is not None else None
            batch = self.runner.inputs.prepare_decode_from_device(ids, positions[active] + step - 1, tokens, size)
            if size is not None:  # copies: the buffers are rewritten by the next replay
                self._hidden_in[: len(ids)].copy_(stream)
                tokens = self.graphs.replay(size, len(ids)).clone()
                stream = self._stream_out[: len(ids)].clone()
            else:
                normed, stream = self._forward(batch.input_ids, batch.positions, stream, batch.attn_batch)
                tokens = self.head.greedy(normed)
            steps.append((active, tokens))
        return collect_drafts(steps, len(request_ids))

    def _forward(self, input_ids, positions, hidden, attn_batch) -> tuple[torch.Tensor, torch.Tensor]:
        metadata = self.loaded.metadata_builder.build_metadata(attn_batch)
        return self.head(input_ids, positions, hidden, ForwardContext(attn_metadata=metadata, kv_caches=self.kv_caches))
