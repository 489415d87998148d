"""Prompts for ``octavo bench serve`` (vLLM's dataset names and flags).

- ``random``: random token ids decoded to text, input and output lengths
  fixed (``--random-range-ratio 0``) or drawn uniformly from
  ``[len * (1 - r), len * (1 + r)]``; ``--random-prefix-len`` tokens shared
  by every prompt in front.
- ``sharegpt``: a ShareGPT-format JSON file (a list of
  ``{"conversations": [{"from": "human", "value": ...}, {"from": "gpt",
  "value": ...}, ...]}``); the first human turn is the prompt, the length of
  the first answer is the output length unless ``--sharegpt-output-len``.
- ``prefix_repetition``: ``--prefix-repetition-num-prefixes`` random
  prefixes, each request one of them plus a random suffix (prefix caching).

Every prompt is text (any OpenAI-compatible server takes it); its length in
tokens is measured by encoding that text, since random ids do not decode
and re-encode to the same count.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

DATASET_NAMES = ("random", "sharegpt", "prefix_repetition")
# ShareGPT rows vLLM's benchmark skips: too short to time, or too long for common contexts.
SHAREGPT_MIN_TOKENS = 4
SHAREGPT_MAX_PROMPT_TOKENS = 1024
SHAREGPT_MAX_TOTAL_TOKENS = 2048


@dataclass
class SampleRequest:
    prompt: str
    prompt_len: int
    expected_output_len: int


def sample_requests(args, tokenizer, rng: random.Random) -> list[SampleRequest]:
    name = args.dataset_name
    if name == "random":
        return _random(args, tokenizer, rng)
    if name == "sharegpt":
        if not args.dataset_path:
            raise ValueError("--dataset-name sharegpt needs --dataset-path FILE.json")
        return _sharegpt(Path(args.dataset_path), args.num_prompts, args.sharegpt_output_len, tokenizer, rng)
    if name == "prefix_repetition":
        return _prefix_repetition(args, tokenizer, rng)
    raise ValueError(f"unknown dataset {name!r} (one of {', '.join(DATASET_NAMES)})")


def _lengths(mean: int, ratio: float, count: int, rng: random.Random) -> list[int]:
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {ratio}")
    low, high = max(1, round(mean * (1 - ratio))), max(1, round(mean * (1 + ratio)))
    return [rng.randint(low, high) for _ in range(count)]


def _ordinary_token_ids(tokenizer) -> list[int]:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    return [i for i in range(len(tokenizer)) if i not in special]


def random_text(tokenizer, vocab: list[int], num_tokens: int, rng: random.Random) -> str:
    """Text of about ``num_tokens`` tokens from random ids (decode, re-encode, trim)."""
    token_ids = [rng.choice(vocab) for _ in range(num_tokens)]
    for _ in range(4):
        text = tokenizer.decode(token_ids)
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) == num_tokens:
            return text
        # Re-encoding merged or split ids: trim, or top up with fresh ones.
        token_ids = encoded[:num_tokens] + [rng.choice(vocab) for _ in range(num_tokens - len(encoded))]
    return tokenizer.decode(token_ids)


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def _random(args, tokenizer, rng: random.Random) -> list[SampleRequest]:
    vocab = _ordinary_token_ids(tokenizer)
    prefix = random_text(tokenizer, vocab, args.random_prefix_len, rng) if args.random_prefix_len else ""
    input_lens = _lengths(args.random_input_len, args.random_range_ratio, args.num_prompts, rng)
    output_lens = _lengths(args.random_output_len, args.random_range_ratio, args.num_prompts, rng)
    requests = []
    for input_len, output_len in zip(input_lens, output_lens):
        prompt = prefix + random_text(tokenizer, vocab, input_len, rng)
        requests.append(SampleRequest(prompt, count_tokens(tokenizer, prompt), output_len))
    return requests


def _prefix_repetition(args, tokenizer, rng: random.Random) -> list[SampleRequest]:
    vocab = _ordinary_token_ids(tokenizer)
    prefixes = [random_text(tokenizer, vocab, args.prefix_repetition_prefix_len, rng)
                for _ in range(args.prefix_repetition_num_prefixes)]
    requests = []
    for index in range(args.num_prompts):
        prompt = prefixes[index % len(prefixes)] + random_text(tokenizer, vocab, args.prefix_repetition_suffix_len, rng)
        requests.append(SampleRequest(prompt, count_tokens(tokenizer, prompt), args.prefix_repetition_output_len))
    rng.shuffle(requests)
    return requests


def _sharegpt(path: Path, num_prompts: int, output_len: int | None, tokenizer, rng: random.Random) -> list[SampleRequest]:
    rows = json.loads(path.read_text())
    rng.shuffle(rows)
    requests = []
    for row in rows:
        turns = row.get("conversations") or row.get("conversation") or []
        if len(turns) < 2:
            continue
        prompt, answer = turns[0].get("value", ""), turns[1].get("value", "")
        prompt_len = count_tokens(tokenizer, prompt)
        completion_len = output_len if output_len is not None else count_tokens(tokenizer, answer)
        too_short = prompt_len < SHAREGPT_MIN_TOKENS or completion_len < SHAREGPT_MIN_TOKENS
        too_long = prompt_len > SHAREGPT_MAX_PROMPT_TOKENS or prompt_len + completion_len > SHAREGPT_MAX_TOTAL_TOKENS
        if too_short or (output_len is None and too_long):
            continue
        requests.append(SampleRequest(prompt, prompt_len, completion_len))
        if len(requests) == num_prompts:
            break
    if len(requests) < num_prompts:
        raise ValueError(f"{path} has only {len(requests)} usable conversations for --num-prompts {num_prompts}")
    return requests
