"""A ``TemplateProcessing`` post-processor's single-text template, applied in Python (issue 21).

BERT's post-processor only puts ``[CLS]`` before a text's ids and ``[SEP]``
after them, yet the ``tokenizers`` library spends longer merging encodings
to do it (about 3 us a text) than Python spends joining three lists. So
where a backend's post-processor is a plain ``TemplateProcessing``, single
texts are encoded without it and the template is applied here: its special
tokens' ids around the text's, each piece with its template type id (the
text's own tokens all take the ``$A`` piece's). Text pairs keep the library's
post-processor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SingleTemplate:
    before: list[int]
    before_types: list[int]
    after: list[int]
    after_types: list[int]
    type_id: int  # the text's own tokens'

    @classmethod
    def of(cls, post_processor: Any) -> SingleTemplate | None:
        """The single-text template of ``post_processor``; None unless it is a plain ``TemplateProcessing``."""
        if post_processor is None or type(post_processor).__name__ != "TemplateProcessing":
            return None
        state = json.loads(post_processor.__getstate__())
        pieces, specials = state.get("single", []), state.get("special_tokens", {})
        sequences = [i for i, piece in enumerate(pieces) if "Sequence" in piece]
        if len(sequences) != 1 or pieces[sequences[0]]["Sequence"].get("id") != "A":
            return None
        sides: list[tuple[list[int], list[int]]] = [([], []), ([], [])]
        for index, piece in enumerate(pieces):
            if index == sequences[0]:
                continue
            special = piece.get("SpecialToken")
            if special is None or special.get("id") not in specials:
                return None
            ids, types = sides[index > sequences[0]]
            token_ids = list(specials[special["id"]]["ids"])
            ids.extend(token_ids)
            types.extend([int(special["type_id"])] * len(token_ids))
        (before, before_types), (after, after_types) = sides
        return cls(before, before_types, after, after_types, int(pieces[sequences[0]]["Sequence"]["type_id"]))

    @property
    def zero_types(self) -> bool:
        """Whether every segment id of a single text is 0 (BERT's template)."""
        return self.type_id == 0 and not any(self.before_types) and not any(self.after_types)

    def ids(self, text_ids: list[int]) -> list[int]:
        return [*self.before, *text_ids, *self.after]

    def type_ids(self, num_text_tokens: int) -> list[int]:
        return [*self.before_types, *([self.type_id] * num_text_tokens), *self.after_types]
