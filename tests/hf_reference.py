"""Hugging Face transformers as the reference: greedy tokens and their logprobs."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch


@dataclass
class HFGreedy:
    token_ids: list[int]
    logprobs: list[float]  # of each chosen token
    top5: list[list[int]]  # top-5 token ids at each step


@lru_cache(maxsize=8)
def _hf_model(path: str, dtype: torch.dtype, device: str = "cpu"):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    except ValueError:  # a vision-language checkpoint transformers does not map to a causal LM
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype).to(device)
    model.eval()
    return model


def hf_greedy(
    path: Path | str, prompt_token_ids: list[int], max_new_tokens: int, dtype=torch.float32, device: str = "cpu"
) -> HFGreedy:
    """Greedy generation with HF, one prompt at a time (no padding effects)."""
    model = _hf_model(str(path), dtype, device)
    input_ids = torch.tensor([prompt_token_ids], device=device)
    with torch.no_grad():
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    token_ids = out.sequences[0, len(prompt_token_ids) :].tolist()
    logprobs, top5 = [], []
    for step, logits in enumerate(out.logits):
        lp = torch.log_softmax(logits[0].float(), dim=-1)
        logprobs.append(float(lp[token_ids[step]]))
        top5.append(torch.topk(lp, 5).indices.tolist())
    return HFGreedy(token_ids, logprobs, top5)


def assert_tokens_match(ours: list[int], ref: HFGreedy, our_top5: list[list[int]] | None = None) -> None:
    """Identical ids; or, past a divergence, a near-tie: each side's token in the other's top-5."""
    if ours == ref.token_ids:
        return
    first = next(i for i, (a, b) in enumerate(zip(ours, ref.token_ids)) if a != b)
    assert our_top5 is not None, f"tokens diverge at step {first}: {ours} vs {ref.token_ids}"
    assert ours[first] in ref.top5[first] and ref.token_ids[first] in our_top5[first], (
        f"tokens diverge at step {first} beyond a near-tie: {ours} vs {ref.token_ids}"
    )
