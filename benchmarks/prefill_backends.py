"""Long-prompt attention: Octavo's paged kernel against what torch ships (issue 26).

Before tuning or writing a prefill kernel for long prompts, measure the ones
that exist: torch SDPA's FlashAttention-2, cuDNN and memory-efficient
backends on the same causal shapes (Llama-3.1-8B: 32 query heads, 8 KV
heads, head size 128, bf16), beside Octavo's paged kernel reading K/V
through the block table and from contiguous K/V (``fresh_kv``), and what the
``triton_sdpa_prefill`` backend runs (``sdpa_parts``: its gather left out). One layer,
L2 flushed, CUDA graphs where they capture; printed: microseconds, TFLOP/s
(causal pairs only) and each against the fastest.

    python benchmarks/prefill_backends.py [--lengths 8192,16384@32768]

A length ``Q@C`` is the last ``Q`` tokens of a ``C``-token prompt (a chunk
with ``C - Q`` tokens of cached context): SDPA sees the whole context with a
bottom-right causal mask there, which only cuDNN and the memory-efficient
backend take (``attn_mask`` from ``causal_lower_right``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kernels_gpu as bench  # noqa: E402


def parse_case(text: str) -> bench.AttnCase:
    query, _, context = text.partition("@")
    query_len = int(query)
    context_len = int(context) if context else query_len
    return bench.AttnCase(f"prefill {query_len} @ {context_len}", [context_len], [query_len])


def one_request(case: bench.AttnCase, inputs: bench.AttnInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The case's query [1, H, Q, D] and its K/V gathered from the cache, [1, Hkv, S, D] views."""
    (context_len,), (query_len,) = case.seq_lens, case.query_lens
    key, value = bench.gathered_kv(inputs.kv_cache, inputs.attn_batch.block_table, context_len)
    q = inputs.query.view(1, query_len, bench.NUM_HEADS, bench.HEAD_SIZE).transpose(1, 2)
    return q, key.transpose(1, 2), value.transpose(1, 2)


def sdpa_call(case: bench.AttnCase, inputs: bench.AttnInputs, backend):
    """SDPA over the case's K/V made contiguous, with ``backend`` only: grouped KV
    heads as they are where it takes them, else repeated."""
    from torch.nn.attention import sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = one_request(case, inputs)
    k, v = k.contiguous(), v.contiguous()
    query_len, context_len = q.shape[2], k.shape[2]
    mask = {"is_causal": True} if query_len == context_len else {"attn_mask": causal_lower_right(query_len, context_len)}

    def attend(k, v, **gqa):
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=bench.SCALE, **mask, **gqa)

    try:
        attend(k, v, enable_gqa=True)
        return (lambda: attend(k, v, enable_gqa=True)), "gqa"
    except (RuntimeError, TypeError):
        pass
    groups = bench.NUM_HEADS // bench.NUM_KV_HEADS
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    attend(k, v)
    return (lambda: attend(k, v)), "heads repeated"


def sdpa_parts_call(case: bench.AttnCase, inputs: bench.AttnInputs):
    """What the ``triton_sdpa_prefill`` backend runs ([Q, H, D] out): the square
    causal SDPA, or for a chunk after context the two parts merged (``sdpa_parts``)."""
    from octavo.runtime.attention.sdpa_parts import causal_sdpa, chunk_attention

    q, k, v = one_request(case, inputs)
    cached = k.shape[2] - q.shape[2]
    if cached == 0:
        return lambda: causal_sdpa(q, k, v, bench.SCALE)[0].transpose(0, 1)
    context, own = (k[:, :, :cached], v[:, :, :cached]), (k[:, :, cached:], v[:, :, cached:])
    out = torch.empty_like(inputs.query)
    return lambda: chunk_attention(q, context, own, bench.SCALE, out)


def time_case(case: bench.AttnCase) -> list[tuple[str, float, str]]:
    """(name, microseconds, note) of every path that runs the case."""
    from torch.nn.attention import SDPBackend

    inputs = bench.AttnInputs(*bench.build_batch(case, torch.Generator().manual_seed(0)))
    rows = []
    for key in ("one_launch", "fresh"):
        call, _ = bench.triton_path(case, inputs, key)
        rows.append((f"octavo {key}", bench.time_us(call, reps=10), ""))
    reference = bench.triton_path(case, inputs, "one_launch")[0]()
    call = sdpa_parts_call(case, inputs)
    out = call()
    rows.append(("octavo sdpa_parts", bench.time_us(call, use_graph=False, reps=10),
                 f"max diff {bench.max_error(out, reference):.3f}"))
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        name = f"sdpa {backend.name.lower()}"
        try:
            call, note = sdpa_call(case, inputs, backend)
            out = call().transpose(1, 2).reshape(-1, bench.NUM_HEADS, bench.HEAD_SIZE)
            note = f"{note}, max diff {bench.max_error(out, reference):.3f}"
            try:
                us = bench.time_us(call, reps=10)
            except RuntimeError:  # does not capture in a graph
                us = bench.time_us(call, use_graph=False, reps=10)
            rows.append((name, us, note))
        except Exception as exc:  # this backend does not take the shape
            rows.append((name, float("nan"), f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}"))
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="8192,16384@32768,32768")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; cuDNN {torch.backends.cudnn.version()}")
    for text in args.lengths.split(","):
        case = parse_case(text)
        rows = time_case(case)
        best = min(us for _, us, _ in rows if us == us)
        print(f"{case.name}: {case.flops / 1e12:.2f} TFLOP a layer")
        for name, us, note in rows:
            if us != us:
                print(f"  {name:24s} {'-':>10}  {note}")
                continue
            tflops = case.flops / (us * 1e-6) / 1e12
            print(f"  {name:24s} {us:10.1f} us {tflops:6.1f} TFLOP/s  x{us / best:4.2f}  {note}")


if __name__ == "__main__":
    main()
