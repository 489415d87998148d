"""The packaged demo model: what a new user's first command runs.

Evidence for issue 7, all in float32 on the CPU:
- ``LLM()`` with no model loads the packaged checkpoint, and its greedy story
  from "Once upon a time" parses against the grammar it was trained on
  (scripts/demo_grammar.py) for 40+ tokens, every word in that grammar;
- Hugging Face transformers loads the same directory and generates the same
  greedy tokens (to and including EOS), with logprobs within 1e-4;
- ``LLM.chat`` renders the chat template, and questions from the training
  distribution get the grammar's answers;
- ``octavo generate`` with no ``--model`` prints that story.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.default_model import DEMO_MODEL_DIR, default_model_path

REPO = Path(__file__).resolve().parents[1]
PROMPT = "Once upon a time"
MAX_TOKENS = 200  # a greedy story is about 100 tokens, then EOS


def _load_grammar():
    spec = importlib.util.spec_from_file_location("demo_grammar", REPO / "scripts" / "demo_grammar.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("demo_grammar", module)
    spec.loader.exec_module(module)
    return module


grammar = _load_grammar()


def greedy(**overrides) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, "max_tokens": MAX_TOKENS, **overrides})


@pytest.fixture(scope="module")
def demo_llm():
    llm = LLM(dtype="float32")  # no model: the packaged demo model
    yield llm
    kv = llm.engine.scheduler.kv
    llm.engine.shutdown()
    assert kv.num_free_blocks == kv.num_blocks, f"{kv.num_blocks - kv.num_free_blocks} KV blocks leaked"


def assert_grammatical_story(text: str) -> grammar.StoryParse:
    parse = grammar.parse_story(text)
    assert parse.complete, (
        f"parses {parse.num_parts}/{len(grammar.STORY_PARTS)} story parts; the rest is {parse.rest!r}"
    )
    unknown = set(grammar.words_of(text)) - grammar.vocabulary()
    assert not unknown, f"words outside the grammar: {sorted(unknown)}"
    return parse


def test_checkpoint_is_a_small_hf_llama():
    assert default_model_path() == DEMO_MODEL_DIR
    names = {p.name for p in DEMO_MODEL_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"} <= names
    config = json.loads((DEMO_MODEL_DIR / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    tokenizer_config = json.loads((DEMO_MODEL_DIR / "tokenizer_config.json").read_text())
    assert tokenizer_config["chat_template"] and tokenizer_config["eos_token"] == "</s>"
    total_bytes = sum(p.stat().st_size for p in DEMO_MODEL_DIR.iterdir())
    assert total_bytes <= 8 * 1024 * 1024, f"the demo model takes {total_bytes} bytes"


def test_llm_without_model_uses_the_demo_model(demo_llm):
    assert Path(demo_llm.engine.info.model_path) == DEMO_MODEL_DIR
    assert demo_llm.engine.info.architecture == "LlamaForCausalLM"


def test_greedy_story_is_grammatical(demo_llm):
    completion = demo_llm.generate(PROMPT, greedy())[0].outputs[0]
    assert completion.finish_reason == "stop", "the story should end with EOS"
    assert len(completion.token_ids) >= 40
    assert_grammatical_story(PROMPT + completion.text)


def test_story_keeps_its_cast(demo_llm):
    """A prompt that fixes the hero: the story goes on about that hero."""
    prompts = [
        "Once upon a time, there was a brave bear named Max.",
        "Once upon a time, there was a shy frog named Ella. Ella lived in a big forest.",
    ]
    outputs = demo_llm.generate(prompts, greedy())
    for prompt, output, (name, animal) in zip(prompts, outputs, [("Max", "bear"), ("Ella", "frog")]):
        parse = assert_grammatical_story(prompt + output.outputs[0].text)
        assert (parse.cast["Name"], parse.cast["animal"]) == (name, animal)


FACT_QUESTIONS = [
    "What does a cow say?",
    "What sound does a duck make?",
    "Where does a bear live?",
    "What does a mouse eat?",
    "How many legs does a bird have?",
    "What color is the sky?",
    "What color is a carrot?",
    "Who are you?",
]


def test_chat_answers_fact_questions(demo_llm):
    outputs = demo_llm.chat([[{"role": "user", "content": q}] for q in FACT_QUESTIONS], greedy())
    for question, output in zip(FACT_QUESTIONS, outputs):
        assert output.outputs[0].text == grammar.answer_for(question), question
        assert output.outputs[0].finish_reason == "stop"


def test_chat_follows_the_last_turn(demo_llm):
    conversation = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What does a cat say?"},
        {"role": "assistant", "content": "A cat says meow."},
        {"role": "user", "content": "Where does a pig live?"},
    ]
    output = demo_llm.chat(conversation, greedy())[0].outputs[0]
    assert output.text == "A pig lives on a farm."


def test_chat_tells_a_story_about_the_animal_asked_for(demo_llm):
    output = demo_llm.chat([{"role": "user", "content": "Tell me a story about a dog."}], greedy())[0].outputs[0]
    parse = assert_grammatical_story(output.text)
    assert parse.cast["animal"] == "dog"


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(DEMO_MODEL_DIR), dtype=torch.float32)
    return model.eval()


def _hf_greedy(model, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
    """HF greedy to EOS (or MAX_TOKENS): the new ids and each chosen token's logprob."""
    input_ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=MAX_TOKENS,
                             do_sample=False, output_logits=True, return_dict_in_generate=True)
    new_ids = out.sequences[0, len(prompt_ids):].tolist()
    logprobs = [float(torch.log_softmax(logits[0].float(), -1)[t]) for t, logits in zip(new_ids, out.logits)]
    return new_ids, logprobs


def test_greedy_matches_hugging_face(demo_llm, hf_model):
    tokenizer = demo_llm.get_tokenizer()
    prompts = [
        {"prompt_token_ids": tokenizer.encode(PROMPT)},
        demo_llm.render_chat([{"role": "user", "content": "Can you tell me a story?"}]),
        demo_llm.render_chat([{"role": "user", "content": "What does a lion eat?"}]),
    ]
    outputs = demo_llm.generate(prompts, greedy(logprobs=1, skip_special_tokens=False))
    for prompt, output in zip(prompts, outputs):
        completion = output.outputs[0]
        hf_ids, hf_logprobs = _hf_greedy(hf_model, prompt["prompt_token_ids"])
        assert completion.token_ids == hf_ids
        for token_id, entry, hf_logprob in zip(completion.token_ids, completion.logprobs, hf_logprobs):
            assert abs(entry[token_id].logprob - hf_logprob) < 1e-4


def test_cli_generate_without_model_prints_the_story(capsys):
    from octavo.entrypoints.cli.main import main

    assert main(["generate", PROMPT, "--dtype", "float32"]) == 0
    text = capsys.readouterr().out.strip()
    assert_grammatical_story(text)
