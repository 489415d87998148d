"""The physical floor of a step: what it must read and compute, over what
the hardware allows (``ceilings.py``), counted from the model as loaded
(``inventory.py``).

A step cannot beat ``max(bytes / copy bandwidth, sum of FLOPs / matmul rate
of their kind)``:

- decode (``batch`` sequences of ``context`` tokens, one new token each):
  reads every dense weight as stored (quantized bytes with their scales and
  zero points), the routed experts it touches, one embedding row per
  sequence, and every sequence's keys and values in the cache's dtype;
  computes ``2 x params`` per token for the linear layers (``k`` experts per
  token for MoE) and the LM head, and attention's ``4 x width x context``;
- prefill (``num_seqs`` prompts of ``seq_len`` tokens): reads the weights
  once and writes the KV cache; computes ``2 x params x tokens`` for the
  linear layers, the LM head for the one row per sequence that produces a
  logit, and causal attention's two products, ``2 x L^2 x width`` per layer
  (``width`` = heads x head_dim; a sliding window caps the keys per query).

MoE: at batch ``B`` a layer with ``E`` experts routing ``k`` per token
touches ``E * (1 - (1 - k/E)^B)`` distinct experts on average (uniform,
independent routing).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from octavo.benchmarks.ceilings import DeviceCeilings, si
from octavo.benchmarks.inventory import WeightInventory


@dataclass
class StepWork:
    bytes: float
    flops: Counter  # matmul kind -> FLOPs


@dataclass
class Floor:
    seconds: float
    bound: str  # "memory" or "compute"
    work: StepWork


def expected_experts_touched(num_experts: int, experts_per_token: int, num_tokens: float) -> float:
    """Distinct experts a layer reads for ``num_tokens`` tokens, on average."""
    return num_experts * (1.0 - (1.0 - experts_per_token / num_experts) ** num_tokens)


def causal_pairs(seq_len: float, window: int | None) -> float:
    """(query, key) products of a causal prompt: ``L^2 / 2``; a window of ``W``
    caps each query's keys at ``W``."""
    if window is None or seq_len <= window:
        return seq_len * seq_len / 2
    return window * window / 2 + (seq_len - window) * window


def _kv_tokens_read(inventory: WeightInventory, context: float) -> float:
    """Tokens of KV read per sequence, summed over layers (windows cap them)."""
    return sum(context if w is None else min(context, w) for w in inventory.attention.sliding_windows)


def _floor(work: StepWork, ceilings: DeviceCeilings) -> Floor:
    memory = work.bytes / ceilings.copy_bytes_per_s
    compute = sum(flops / ceilings.matmul_rate(kind) for kind, flops in work.flops.items())
    return Floor(max(memory, compute), "compute" if compute > memory else "memory", work)


def _linear_flops(inventory: WeightInventory, tokens: float, logit_rows: float) -> Counter:
    flops = Counter({kind: 2 * params * tokens for kind, params in inventory.linear_params.items()})
    for group in inventory.experts:
        flops[group.kind] += 2 * group.matmul_params * group.experts_per_token / group.num_experts * tokens
    flops[inventory.model_kind] += 2 * inventory.lm_head_params * logit_rows
    return flops


def _expert_bytes(inventory: WeightInventory, tokens: float) -> float:
    return sum(
        group.bytes * expected_experts_touched(group.num_experts, group.experts_per_token, tokens) / group.num_experts
        for group in inventory.experts
    )


def decode_step_work(inventory: WeightInventory, batch: int, context: float) -> StepWork:
    attention = inventory.attention
    kv_tokens = _kv_tokens_read(inventory, context)
    read = inventory.dense_bytes + _expert_bytes(inventory, batch) + batch * inventory.embedding_row_bytes
    read += batch * kv_tokens * attention.kv_bytes_per_token_layer
    flops = _linear_flops(inventory, batch, batch)
    flops[inventory.model_kind] += batch * 4 * attention.query_width * kv_tokens
    return StepWork(read, flops)


def prefill_work(inventory: WeightInventory, num_seqs: int, seq_len: int) -> StepWork:
    attention = inventory.attention
    tokens = num_seqs * seq_len
    moved = inventory.dense_bytes + _expert_bytes(inventory, tokens) + tokens * inventory.embedding_row_bytes
    moved += tokens * attention.num_layers * attention.kv_bytes_per_token_layer  # the KV cache written
    flops = _linear_flops(inventory, tokens, num_seqs)
    pairs = sum(causal_pairs(seq_len, window) for window in attention.sliding_windows)
    flops[inventory.model_kind] += num_seqs * 4 * attention.query_width * pairs
    return StepWork(moved, flops)


def decode_step_floor(inventory: WeightInventory, ceilings: DeviceCeilings, batch: int, context: float) -> Floor:
    return _floor(decode_step_work(inventory, batch, context), ceilings)


def prefill_floor(inventory: WeightInventory, ceilings: DeviceCeilings, num_seqs: int, seq_len: int) -> Floor:
    return _floor(prefill_work(inventory, num_seqs, seq_len), ceilings)


def _gb(num_bytes: float) -> str:
    return f"{si(num_bytes)}B"


def describe(inventory: WeightInventory, ceilings: DeviceCeilings) -> str:
    """What the floor counts, in a few lines under the table."""
    attention = inventory.attention
    linears = ", ".join(
        f"{_gb(inventory.linear_bytes[kind])} multiplying in {kind}" for kind in inventory.linear_bytes
    )
    lines = [
        f"floor = max(bytes / {si(ceilings.copy_bytes_per_s)}B/s, FLOPs / matmul rate of their kind: "
        + ", ".join(f"{kind} {si(rate)}FLOP/s" for kind, rate in ceilings.matmul_flops_per_s.items()) + ")",
        f"  weights as loaded (quantized bytes with scales and zero points): linear layers {linears}; "
        f"LM head {_gb(inventory.lm_head_bytes)}; norms {_gb(inventory.other_bytes)}; "
        "embedding: only the rows looked up",
        f"  KV cache {attention.kv_dtype}: {attention.num_layers * attention.kv_bytes_per_token_layer / 1024:.1f} KiB "
        "per token, read for every sequence's context at each decode step",
        f"  FLOPs: 2 x {si(sum(inventory.linear_params.values())).strip()} linear params per token; LM head only on "
        f"the rows that produce logits; causal attention 2 x L^2 x {attention.query_width} per layer in prefill",
    ]
    for group in inventory.experts:
        lines.append(
            f"  MoE: {group.experts_per_token} of {group.num_experts} experts per token ({_gb(group.bytes)} in all); "
            "a step reads the E(1-(1-k/E)^tokens) experts it is expected to touch"
        )
    return "\n".join(lines)
