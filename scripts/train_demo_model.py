"""Train Octavo's demo model: a small Llama on a generated corpus, plain torch.

    python scripts/train_demo_model.py            # writes octavo/assets/demo-model/

The corpus comes from ``scripts/demo_grammar.py`` (children's stories and
chat turns rendered with the chat template), so no outside data is needed.
Everything is seeded: the same seed, torch version and thread count give the
same corpus, tokenizer and weights. Training rows start at a document start,
as generation does, so that position 0 in training looks like a prompt's.
The checkpoint is written with transformers' own ``LlamaForCausalLM``
(``save_pretrained``), in float32.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import demo_grammar  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "octavo" / "assets" / "demo-model"
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
EOS = "</s>"


@dataclass
class TrainConfig:
    seed: int = 0
    threads: int = 2
    num_docs: int = 60_000
    story_fraction: float = 0.5
    vocab_size: int = 1024
    seq_len: int = 512
    batch_size: int = 16
    steps: int = 800
    warmup_steps: int = 40
    lr: float = 3e-3
    min_lr_ratio: float = 0.05
    weight_decay: float = 0.1
    hidden_size: int = 192
    intermediate_size: int = 512
    num_layers: int = 4
    num_heads: int = 6
    num_kv_heads: int = 2
    log_every: int = 50


def chat_template() -> str:
    from octavo.default_model import CHAT_TEMPLATE

    return CHAT_TEMPLATE


def build_corpus(config: TrainConfig) -> tuple[list[str], list[list[dict[str, str]]]]:
    """Stories (each ending in EOS) and conversations, in one seeded stream."""
    rng = random.Random(config.seed)
    stories, conversations = [], []
    for _ in range(config.num_docs):
        if rng.random() < config.story_fraction:
            stories.append(demo_grammar.make_story(rng).text)
        else:
            conversations.append(demo_grammar.make_conversation(rng))
    return stories, conversations


def render_documents(stories, conversations) -> list[str]:
    import jinja2

    template = jinja2.Environment().from_string(chat_template())
    documents = [story + EOS for story in stories]
    documents += [template.render(messages=c, add_generation_prompt=False) for c in conversations]
    return documents


def train_tokenizer(stories, conversations, config: TrainConfig):
    """Byte-level BPE; the special tokens are never split, so merges learn only plain text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = stories + [m["content"] for c in conversations for m in c]
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def pack_rows(token_lists: list[list[int]], row_len: int, rng: random.Random) -> torch.Tensor:
    """Rows of ``row_len`` tokens, each starting at a document start; the tail that
    does not fit a row is dropped (a row never starts mid-document)."""
    order = list(range(len(token_lists)))
    rng.shuffle(order)
    rows, row = [], []
    for index in order:
        row.extend(token_lists[index])
        if len(row) >= row_len:
            rows.append(row[:row_len])
            row = []
    return torch.tensor(rows, dtype=torch.long)


def build_model(config: TrainConfig, vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(config.seed)
    model_config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.seq_len,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=SPECIAL_TOKENS.index("<s>"),
        eos_token_id=SPECIAL_TOKENS.index(EOS),
        pad_token_id=SPECIAL_TOKENS.index("<pad>"),
    )
    return LlamaForCausalLM(model_config)


def learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warmup, then cosine decay to ``min_lr_ratio`` of the peak."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * cosine)


def make_optimizer(model, config: TrainConfig) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 or "embed" in n]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95), eps=1e-8)


def train(model, rows: torch.Tensor, config: TrainConfig) -> float:
    """Plain-torch training; returns the mean loss of the last ``log_every`` steps."""
    optimizer = make_optimizer(model, config)
    generator = torch.Generator().manual_seed(config.seed)
    model.train()
    recent: list[float] = []
    start = time.time()
    for step in range(config.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        batch = rows[torch.randint(len(rows), (config.batch_size,), generator=generator)]
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        recent = (recent + [loss.item()])[-config.log_every :]
        if (step + 1) % config.log_every == 0 or step == 0:
            print(f"step {step + 1:5d}/{config.steps}  loss {sum(recent) / len(recent):.4f}  "
                  f"lr {learning_rate(step, config):.2e}  {time.time() - start:6.0f}s", flush=True)
    model.eval()
    return sum(recent) / len(recent)


@torch.no_grad()
def story_loss_and_floor(model, tokenizer, config: TrainConfig, num_stories: int = 200) -> tuple[float, float]:
    """Held-out story loss (nats/token) and the grammar's own entropy per token,
    the lowest loss any model can reach on these stories."""
    rng = random.Random(config.seed + 1)
    total_loss = total_nats = 0.0
    total_tokens = 0
    for _ in range(num_stories):
        story = demo_grammar.make_story(rng)
        ids = torch.tensor([tokenizer.encode(story.text + EOS).ids])
        num_predicted = ids.shape[1] - 1
        total_loss += model(input_ids=ids, labels=ids).loss.item() * num_predicted
        total_nats += story.nats
        total_tokens += num_predicted
    return total_loss / total_tokens, total_nats / total_tokens


def save_checkpoint(model, tokenizer, out_dir: Path) -> None:
    from transformers import GenerationConfig

    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.iterdir():
        if stale.is_file():
            stale.unlink()
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id,
        eos_token_id=model.config.eos_token_id,
        pad_token_id=model.config.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(str(out_dir))
    tokenizer.save(str(out_dir / "tokenizer.json"))
    special = {"bos_token": "<s>", "eos_token": EOS, "pad_token": "<pad>"}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "additional_special_tokens": SPECIAL_TOKENS[3:],
        "add_bos_token": False,
        "model_max_length": model.config.max_position_embeddings,
        "chat_template": chat_template(),
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def greedy_story(model, tokenizer, prompt: str = "Once upon a time", max_new_tokens: int = 200) -> str:
    ids = torch.tensor([tokenizer.encode(prompt).ids])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=model.config.pad_token_id)
    return prompt + tokenizer.decode(out[0, ids.shape[1]:].tolist())


def parse_args() -> tuple[TrainConfig, Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    defaults = TrainConfig()
    for name, value in vars(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args()
    config = TrainConfig(**{name: getattr(args, name) for name in vars(defaults)})
    return config, args.out


def main() -> int:
    config, out_dir = parse_args()
    wall_start, cpu_start = time.time(), time.process_time()
    torch.set_num_threads(config.threads)
    random.seed(config.seed)
    torch.manual_seed(config.seed)

    stories, conversations = build_corpus(config)
    tokenizer = train_tokenizer(stories, conversations, config)
    documents = render_documents(stories, conversations)
    token_lists = [encoding.ids for encoding in tokenizer.encode_batch(documents)]
    num_tokens = sum(len(t) for t in token_lists)
    rows = pack_rows(token_lists, config.seq_len, random.Random(config.seed))
    print(f"corpus: {len(stories)} stories, {len(conversations)} conversations, {num_tokens} tokens "
          f"({sum(map(len, documents)) / 1e6:.1f} MB of text); vocab {tokenizer.get_vocab_size()}; "
          f"{len(rows)} rows of {config.seq_len}", flush=True)

    model = build_model(config, tokenizer.get_vocab_size())
    num_params = sum(p.numel() for p in model.parameters())
    print(f"model: {num_params / 1e6:.2f}M parameters; {config.steps} steps x {config.batch_size} x {config.seq_len} "
          f"= {config.steps * config.batch_size * config.seq_len / 1e6:.1f}M tokens", flush=True)
    final_loss = train(model, rows, config)
    story_loss, floor = story_loss_and_floor(model, tokenizer, config)
    save_checkpoint(model, tokenizer, out_dir)

    sample = greedy_story(model, tokenizer)
    parse = demo_grammar.parse_story(sample)
    print(f"final training loss {final_loss:.4f}; held-out story loss {story_loss:.4f} "
          f"(grammar entropy {floor:.4f} nats/token)")
    print(f"greedy: {sample!r}\nparses as a complete story: {parse.complete}")
    print(f"wall time {time.time() - wall_start:.0f}s; process CPU time {time.process_time() - cpu_start:.0f}s "
          f"({config.threads} threads); saved to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
