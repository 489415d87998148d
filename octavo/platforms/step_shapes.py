"""Static step shapes: the buckets a compiling platform pads steps to (plugin API 1.1).

A platform that compiles whole steps (XLA on a TPU, HPU graph mode,
``torch.compile``) compiles one program per distinct set of input shapes. It
declares ``StepBuckets`` (``Platform.step_buckets``); the model runner pads
every step the buckets cover to the smallest ``StepShape`` that fits, so the
platform compiles once per bucket, all of them during warm-up, and never in
steady state.

A shape has four numbers:

* ``num_reqs``: a request bucket. Padding requests have no tokens and no
  context.
* ``num_tokens``: for a decode step (every request computes one token) the
  request bucket itself; otherwise a token bucket. Padding tokens belong to
  no request: slot -1 (nothing is written), position 0, token 0.
* ``max_query_len``: 1 for a decode step, ``num_tokens`` otherwise, so that
  the attention's padded query length is part of the shape, not of the data.
* ``block_table_width``: a width bucket (columns of the block table; the
  attention sees ``width * block_size`` positions of context). 0 when the
  buckets have no widths: then the attention metadata is not padded at all
  (the attention runs outside the compiled program, as an opaque op), only
  the tokens and the sampled rows are.

The rows the step samples are padded to ``num_reqs`` (padding rows read the
first token's hidden state; nothing is sampled from them).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class StepShape:
    num_tokens: int
    num_reqs: int
    max_query_len: int
    block_table_width: int  # 0: attention metadata not padded

    @property
    def is_decode(self) -> bool:
        return self.max_query_len == 1

    def describe(self) -> str:
        kind = "decode" if self.is_decode else "mixed"
        width = f", {self.block_table_width} blocks" if self.block_table_width else ""
        return f"{kind} {self.num_tokens} tokens / {self.num_reqs} requests{width}"


def power_of_two_sizes(smallest: int, largest: int) -> tuple[int, ...]:
    """``smallest``, twice that, ... below ``largest``, then ``largest`` itself."""
    sizes = []
    size = max(1, smallest)
    while size < largest:
        sizes.append(size)
        size *= 2
    sizes.append(largest)
    return tuple(sizes)


def _smallest_fit(sizes: tuple[int, ...], needed: int) -> int | None:
    index = bisect.bisect_left(sizes, needed)
    return sizes[index] if index < len(sizes) else None


@dataclass(frozen=True)
class StepBuckets:
    """The sizes a platform compiles steps for, each tuple ascending.

    ``token_sizes`` empty: only decode steps are padded (others run as they
    come, outside the compiled path). ``block_table_widths`` empty: attention
    inputs are not padded (see the module docstring)."""

    request_sizes: tuple[int, ...]
    token_sizes: tuple[int, ...] = ()
    block_table_widths: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("request_sizes", "token_sizes", "block_table_widths"):
            sizes = getattr(self, name)
            if list(sizes) != sorted(set(sizes)) or any(s <= 0 for s in sizes):
                raise ValueError(f"StepBuckets.{name} must be ascending positive sizes, got {sizes}")
        if not self.request_sizes:
            raise ValueError("StepBuckets.request_sizes must not be empty")

    def shape_for(self, num_tokens: int, num_reqs: int, num_blocks: int) -> StepShape | None:
        """The bucket for a step of ``num_tokens`` tokens over ``num_reqs``
        requests whose longest context spans ``num_blocks`` blocks; None when
        no bucket fits (the step then runs unpadded)."""
        reqs = _smallest_fit(self.request_sizes, num_reqs)
        if reqs is None:
            return None
        if num_tokens == num_reqs:
            tokens, query = reqs, 1
        else:
            tokens = _smallest_fit(self.token_sizes, num_tokens)
            if tokens is None:
                return None
            query = tokens
        width = 0
        if self.block_table_widths:
            width = _smallest_fit(self.block_table_widths, num_blocks)
            if width is None:
                return None
        return StepShape(tokens, reqs, query, width)

    def shapes(self) -> list[StepShape]:
        """Every shape a step can be padded to: what warm-up compiles."""
        widths = self.block_table_widths or (0,)
        decode = [StepShape(r, r, 1, w) for r in self.request_sizes for w in widths]
        mixed = [StepShape(t, r, t, w) for t in self.token_sizes for r in self.request_sizes for w in widths]
        return decode + mixed

    def describe(self) -> str:
        parts = [f"requests {list(self.request_sizes)}"]
        parts.append(f"tokens {list(self.token_sizes)}" if self.token_sizes else "decode steps only")
        if self.block_table_widths:
            parts.append(f"block-table widths {list(self.block_table_widths)}")
        return f"{len(self.shapes())} step shapes: " + ", ".join(parts)
