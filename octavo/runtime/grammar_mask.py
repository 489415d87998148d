"""A step's grammar masks (``GrammarBitmask``, host bytes) -> ``AllowedTokens``
on the device, lined up with the rows of the step's logits.

The copy goes through a pinned staging buffer so that it is asynchronous:
from pageable memory it would wait for the device to finish the step that is
running (with decode overlap, the next step's forward pass). The staging
buffer is rewritten only after the previous upload out of it has run. Pinned
memory and the event that says so come from the platform
(``pins_host_memory``, ``create_event``); where it offers neither, the copy
is a plain synchronous one.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from octavo.core.scheduler_output import GrammarBitmask
from octavo.runtime.sampler import AllowedTokens


class GrammarMaskUploader:
    def __init__(
        self, device: torch.device, pin_memory: bool = False, create_event: Callable[[], object | None] = lambda: None
    ) -> None:
        self.device = device
        self.pin_memory = pin_memory
        self.create_event = create_event
        self._staging: torch.Tensor | None = None
        self._uploaded = None  # device event: the last copy out of the staging buffer ran

    def upload(self, bitmask: GrammarBitmask | None, logits_rows: dict[str, int]) -> AllowedTokens | None:
        """Masks for the requests in ``logits_rows`` (request id -> its first
        logits row; a request with several mask rows has as many logits rows
        from there on); None if none is masked."""
        if bitmask is None:
            return None
        words = np.frombuffer(bitmask.words, dtype="<i4").reshape(-1, bitmask.num_words)
        mask_rows = bitmask.rows_of()
        keep = [i for i, (r, _) in enumerate(mask_rows) if r in logits_rows]
        if not keep:
            return None
        rows = [logits_rows[mask_rows[i][0]] + mask_rows[i][1] for i in keep]
        if rows == list(range(len(logits_rows))):  # every row masked, in order: no gather
            return AllowedTokens(words=self._to_device(np.ascontiguousarray(words[keep])), rows=None)
        # One block: the words, then each row's logits row in the last column.
        block = np.empty((len(keep), bitmask.num_words + 1), dtype=np.int32)
        block[:, :-1] = words[keep]
        block[:, -1] = rows
        on_device = self._to_device(block)
        return AllowedTokens(words=on_device[:, :-1], rows=on_device[:, -1].long())

    def _to_device(self, block: np.ndarray) -> torch.Tensor:
        if self.device.type == "cpu":
            return torch.from_numpy(block if block.flags.writeable else block.copy())
        uploaded = self.create_event() if self.pin_memory else None
        if uploaded is None:  # no pinned staging or no event to wait on: a plain (synchronous) copy
            return torch.from_numpy(block).to(self.device)
        if self._uploaded is not None:
            self._uploaded.synchronize()
        if self._staging is None or self._staging.numel() < block.size:
            self._staging = torch.empty(max(block.size, 2 * (self._staging.numel() if self._staging is not None else 0)),
                                        dtype=torch.int32, pin_memory=True)
        staging = self._staging[: block.size].view(block.shape)
        staging.numpy()[:] = block
        on_device = staging.to(self.device, non_blocking=True)
        uploaded.record()
        self._uploaded = uploaded
        return on_device
