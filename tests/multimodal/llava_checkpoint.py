"""A small random LLaVA-1.5 checkpoint that takes real images: a CLIP tower
over 56x56 images (16 image rows a picture), a Llama language model, the
byte-level test tokenizer with ``<image>`` added, a LLaVA chat template that
walks content parts, and CLIP's image processor config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from tests.models.test_llava import TEXT

VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=56,
              patch_size=14)
TOKENS_PER_IMAGE = 16
# The llava-hf template's shape: a turn's images first, then its text.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'].upper() + ': ' }}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>\n{% endif %}{% endfor %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "\n{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def _tokenizer_with_image_token(tokenizer_dir: Path, out: Path) -> int:
    from tokenizers import AddedToken, Tokenizer

    for file in tokenizer_dir.iterdir():
        shutil.copy(file, out / file.name)
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken("<image>", special=True, normalized=False)])
    tokenizer.save(str(out / "tokenizer.json"))
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config))
    return tokenizer.token_to_id("<image>")


def build_llava_checkpoint(out: Path, tokenizer_dir: Path):
    """(checkpoint dir, the transformers model in float32, the image token id)."""
    import transformers as t
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    out.mkdir(parents=True, exist_ok=True)
    image_token = _tokenizer_with_image_token(tokenizer_dir, out)
    config = t.LlavaConfig(
        text_config=t.LlamaConfig(**TEXT, vocab_size=image_token + 1), vision_config=t.CLIPVisionConfig(**VISION),
        image_token_index=image_token, vision_feature_layer=-2, vision_feature_select_strategy="default",
    )
    torch.manual_seed(7)
    model = t.LlavaForConditionalGeneration(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0.0, 0.1)
    model.eval().save_pretrained(str(out))
    CLIPImageProcessorPil(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56}).save_pretrained(str(out))
    return out, model, image_token
