"""The target's hidden states an EAGLE-3 head reads (``models/eagle3.py``).

``DecoderModel`` mixes this in: once ``keep_aux_hidden_states`` is called
(by ``runtime/eagle_proposer.py``, before any graph is captured), every
forward copies the residual stream entering the chosen layers into one
persistent buffer, so that replayed graphs write it too; until then the
forward pays one empty-dict test per layer.
"""

from __future__ import annotations

import torch


class AuxHiddenStates:
    # Layer index -> the buffer slots its input stream goes to (empty: off).
    aux_slots: dict[int, list[int]] = {}
    aux_hidden: torch.Tensor | None = None

    def keep_aux_hidden_states(self, layer_ids: tuple[int, ...], max_tokens: int) -> torch.Tensor:
        """From now on every forward copies the residual stream entering each
        layer of ``layer_ids`` (``num_hidden_layers``: the stream after the
        last one) into the returned buffer, side by side in that order, one
        row per token."""
        weight = self.embed_tokens.weight
        slots: dict[int, list[int]] = {}
        for slot, layer in enumerate(layer_ids):
            slots.setdefault(layer, []).append(slot)
        width = len(layer_ids) * weight.shape[1]
        self.aux_hidden = torch.zeros(max_tokens, width, dtype=weight.dtype, device=weight.device)
        self.aux_slots = slots
        return self.aux_hidden

    def _keep_aux(self, layer: int, hidden: torch.Tensor, residual: torch.Tensor | None, normed: bool) -> None:
        slots = self.aux_slots.get(layer)
        if not slots:
            return
        # The stream: ``residual`` where ``hidden`` is already the next norm's output.
        stream = residual if normed else hidden if residual is None else hidden + residual
        rows, width = stream.shape
        for slot in slots:
            self.aux_hidden[:rows, slot * width : (slot + 1) * width].copy_(stream)
