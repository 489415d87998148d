"""End to end on a platform: a tiny random Llama through ``LLM``, against
Hugging Face transformers in the same dtype, on the platform's
``reference_device()`` (its own device, unless it compiles whole programs:
then the CPU). The summary says where the reference ran.

The checkpoint is built with transformers in a temporary directory (no
download): 2 layers, GQA (4 query heads, 2 KV heads), a 512-token vocabulary,
weights drawn wider than the default init so that greedy choices are rarely
near-ties. No tokenizer: prompts are token ids.

Two rounds of greedy generation, 16 tokens each, with a 24-token step budget
so that longer prompts are chunked: first four prompts of different lengths,
then prompts that share whole blocks with the first round's (prefix-cache
hits, which the check confirms happened). Every completion must equal HF's
token for token, or diverge only at a near-tie (each side's token in the
other's top 5); the chosen tokens' logprobs must agree to within
``LOGPROB_TOL`` while the sequences agree. All KV blocks must be free after.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from octavo.platforms.interface import Platform
from octavo.testing.conformance.checks import ConformanceFailure

NUM_NEW_TOKENS = 16
VOCAB_SIZE = 512
LOGPROB_TOL = {torch.float32: 1e-3, torch.bfloat16: 0.1, torch.float16: 0.05}


@dataclass
class Greedy:
    token_ids: list[int]
    logprobs: list[float]
    top5: list[list[int]]


# The size fields of a tiny decoder, understood by most transformers configs.
TINY_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    bos_token_id=0,
    eos_token_id=1,
    rms_norm_eps=1e-6,
)


def build_tiny_llama(out_dir: Path, seed: int = 0) -> Path:
    """A random 2-layer Llama checkpoint (safetensors) in ``out_dir``."""
    return build_tiny_checkpoint(out_dir, "LlamaForCausalLM", seed=seed)


def build_tiny_checkpoint(out_dir: Path, hf_class: str, architecture: str | None = None, seed: int = 0) -> Path:
    """A random 2-layer checkpoint of the transformers class ``hf_class``,
    with ``architectures = [architecture]`` (default: the class's name)."""
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if (out_dir / "config.json").exists():
        return out_dir
    model_class = getattr(transformers, hf_class)
    config = model_class.config_class(**TINY_CONFIG)
    torch.manual_seed(seed)
    model = model_class(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0.0, 0.08)
    model.config.architectures = [architecture or hf_class]
    model.save_pretrained(str(out_dir))
    return out_dir


def make_prompts(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """First-round prompts, and second-round prompts sharing blocks with them."""
    rng = random.Random(seed)
    first = [[rng.randrange(3, VOCAB_SIZE) for _ in range(n)] for n in (3, 17, 40, 64)]
    tail = [rng.randrange(3, VOCAB_SIZE) for _ in range(7)]
    second = [first[3][:48] + tail, first[2][:32] + tail[:2], first[1]]
    return first, second


def hf_greedy(path: Path, prompts: list[list[int]], dtype: torch.dtype, device: torch.device) -> list[Greedy]:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()
    results = []
    for prompt in prompts:
        input_ids = torch.tensor([prompt], device=device)
        with torch.no_grad():
            out = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=NUM_NEW_TOKENS,
                min_new_tokens=NUM_NEW_TOKENS,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=2,
            )
        token_ids = out.sequences[0, len(prompt) :].tolist()
        logprobs = [torch.log_softmax(step[0].float(), dim=-1).cpu() for step in out.logits]
        results.append(
            Greedy(
                token_ids,
                [float(lp[t]) for lp, t in zip(logprobs, token_ids)],
                [torch.topk(lp, 5).indices.tolist() for lp in logprobs],
            )
        )
    del model
    return results


def _octavo_greedy(outputs) -> list[Greedy]:
    results = []
    for output in outputs:
        completion = output.outputs[0]
        top5 = [sorted(entry, key=lambda t: entry[t].rank)[:5] for entry in completion.logprobs]
        chosen = [entry[t].logprob for t, entry in zip(completion.token_ids, completion.logprobs)]
        results.append(Greedy(list(completion.token_ids), chosen, top5))
    return results


def compare(ours: Greedy, ref: Greedy, tolerance: float, label: str) -> float:
    """Max logprob difference over the agreeing steps; raises on a real divergence."""
    worst = 0.0
    for step, (a, b) in enumerate(zip(ours.token_ids, ref.token_ids)):
        if a != b:
            if not (a in ref.top5[step] and b in ours.top5[step]):
                raise ConformanceFailure(
                    f"{label}: greedy tokens diverge at step {step} beyond a near-tie: "
                    f"octavo {ours.token_ids} vs HF {ref.token_ids}"
                )
            break
        worst = max(worst, abs(ours.logprobs[step] - ref.logprobs[step]))
    if worst > tolerance:
        raise ConformanceFailure(
            f"{label}: chosen-token logprobs differ from HF's by {worst:.2e} (tolerance {tolerance})"
        )
    return worst


def octavo_greedy_rounds(platform: Platform, path: Path, dtype: torch.dtype, **options) -> tuple[list, int, int, int]:
    """Both rounds through ``LLM`` on ``platform``: (greedy results per round,
    prefix-hit tokens, free blocks, total blocks)."""
    from octavo import LLM, SamplingParams
    from octavo.runtime.config import dtype_name

    first, second = make_prompts()
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True, logprobs=5)
    llm = LLM(
        str(path),
        platform=platform.name,
        dtype=dtype_name(dtype),
        max_model_len=256,
        max_num_seqs=8,
        max_num_batched_tokens=24,
        skip_tokenizer_init=True,
        **options,
    )
    try:
        ours = [
            _octavo_greedy(llm.generate([{"prompt_token_ids": p} for p in prompts], params))
            for prompts in (first, second)
        ]
        kv = llm.engine.scheduler.kv
        return ours, kv.prefix_cache_stats.num_hits, kv.num_free_blocks, kv.num_blocks
    finally:
        llm.engine.shutdown()
        del llm


def compare_with_hf(platform: Platform, path: Path, dtype: torch.dtype) -> str:
    """Run both rounds of the checkpoint at ``path`` on ``platform`` in ``dtype``,
    and Hugging Face on the platform's ``reference_device()``; a one-line summary."""
    from octavo.runtime.config import dtype_name

    first, second = make_prompts()
    ours, hits, free, total = octavo_greedy_rounds(platform, path, dtype)
    reference_device = platform.reference_device()
    refs = [hf_greedy(path, prompts, dtype, reference_device) for prompts in (first, second)]
    name = dtype_name(dtype)
    worst = 0.0
    for round_index, (round_ours, round_refs) in enumerate(zip(ours, refs)):
        for index, (a, b) in enumerate(zip(round_ours, round_refs)):
            worst = max(worst, compare(a, b, LOGPROB_TOL[dtype], f"{name} round {round_index + 1} prompt {index}"))
    if hits == 0:
        raise ConformanceFailure(f"{name}: the second round got no prefix-cache hit")
    if free != total:
        raise ConformanceFailure(f"{name}: {total - free} of {total} KV blocks still in use after generation")
    exact = sum(a.token_ids == b.token_ids for r_ours, r_refs in zip(ours, refs) for a, b in zip(r_ours, r_refs))
    return (
        f"{name}: {exact}/{len(first) + len(second)} prompts token-identical to HF, "
        f"max logprob diff {worst:.1e}, {hits} prefix-hit tokens (HF ran on {reference_device})"
    )
