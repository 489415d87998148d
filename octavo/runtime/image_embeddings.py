"""Image embedding rows in a step's inputs (the runner's side of ``octavo/multimodal``).

A request's ``ImageFeature``s arrive with its ``NewRequestData``. When a step
first computes positions of an image's placeholder span, the model embeds the
image (``model.image_embeddings``: vision tower and projector) and the rows
are kept until the request's computed tokens pass the span, so a span split
across prompt chunks is embedded once. The step's input embeddings are the
token embeddings with an image's rows written, in order, over the image-token
positions of its span (a span may hold other ids too: Mistral 3's row
breaks, which stay text); steps
that hold image rows run eagerly (no CUDA or prefill graph, no static
step), which only prompt steps do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.core.image_features import ImageFeature
from octavo.core.scheduler_output import SchedulerOutput


@dataclass(frozen=True)
class ImageRows:
    """Rows ``rows`` of an image's embedding go to the step's tokens ``tokens`` (as many)."""

    request_id: str
    feature: ImageFeature
    tokens: list[int]
    rows: list[int]


class ImageEmbeddings:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.image_token_id = model.image_token_id
        self.features: dict[str, list[ImageFeature]] = {}
        self.rows: dict[tuple[str, str], torch.Tensor] = {}  # (request id, image identifier) -> embedding rows

    def apply(self, scheduler_output: SchedulerOutput) -> None:
        """Take the new requests' images; forget those of finished (or re-sent) requests."""
        for request_id in scheduler_output.finished_request_ids:
            self._forget(request_id)
        for new in scheduler_output.new_requests:
            self._forget(new.request_id)
            if new.image_features:
                self.features[new.request_id] = list(new.image_features)

    def plan(self, scheduler_output: SchedulerOutput, states) -> list[ImageRows]:
        """The image rows this step's tokens take (``states``: the runner's, already updated)."""
        if not self.features:
            return []
        planned, token = [], 0
        for request_id, count in scheduler_output.num_scheduled_tokens.items():
            features = self.features.get(request_id)
            if features:
                state = states[request_id]
                start = state.num_computed_tokens
                parts = _overlaps(features, start, start + count, state.token_ids, self.image_token_id)
                planned.extend(ImageRows(request_id, f, [token + p - start for p in ps], rows) for f, ps, rows in parts)
                self._drop_passed(request_id, features, start)
            token += count
        return planned

    def inputs_embeds(self, input_ids: torch.Tensor, planned: list[ImageRows]) -> torch.Tensor:
        """The token embeddings of ``input_ids`` with the planned image rows written in."""
        embeds = self.model.embed_input_ids(input_ids)
        for part in planned:
            rows = self._rows(part.request_id, part.feature)
            tokens = torch.tensor(part.tokens, device=embeds.device)
            embeds[tokens] = rows[torch.tensor(part.rows, device=rows.device)].to(embeds.dtype)
        return embeds

    def _rows(self, request_id: str, feature: ImageFeature) -> torch.Tensor:
        key = (request_id, feature.identifier)
        rows = self.rows.get(key)
        if rows is None:
            device = next(self.model.parameters()).device
            pixels = feature.pixel_values().to(device).unsqueeze(0)
            rows = self.model.image_embeddings(pixels)[0]
            self.rows[key] = rows
        return rows

    def _drop_passed(self, request_id: str, features: list[ImageFeature], start: int) -> None:
        """Free the rows of images whose whole span was computed before ``start``; once
        all were, the request's decode steps no longer look here (a preempted request
        comes back with its images in its ``NewRequestData``)."""
        for feature in features:
            if feature.end <= start:
                self.rows.pop((request_id, feature.identifier), None)
        if all(feature.end <= start for feature in features):
            del self.features[request_id]

    def _forget(self, request_id: str) -> None:
        features = self.features.pop(request_id, None) or ()
        for feature in features:
            self.rows.pop((request_id, feature.identifier), None)


def _overlaps(features: list[ImageFeature], start: int, end: int, token_ids: list[int], image_token: int):
    """For each feature whose span meets positions ``[start, end)``: the image-token
    positions there and the embedding rows they take (the image tokens of the
    span before a position count its row)."""
    parts = []
    for feature in features:
        lo, hi = max(start, feature.offset), min(end, feature.end)
        if lo >= hi:
            continue
        row = sum(1 for t in token_ids[feature.offset : lo] if t == image_token)
        positions, rows = [], []
        for position in range(lo, hi):
            if token_ids[position] == image_token:
                positions.append(position)
                rows.append(row)
                row += 1
        if positions:
            parts.append((feature, positions, rows))
    return parts
