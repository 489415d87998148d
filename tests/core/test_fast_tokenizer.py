"""FastTokenizer (tokenizers only) against transformers' AutoTokenizer on the
same files: the real Llama 2 tokenizer, the demo model's and the test
fixtures' byte-level BPE; and the cases that must go to transformers."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from octavo.core.detokenizer import IncrementalDetokenizer
from octavo.core.fast_tokenizer import FastTokenizer
from octavo.core.sampling_params import SamplingParams
from octavo.core.tokenizer import load_tokenizer, load_transformers_tokenizer, transformers_tokenizer
from octavo.default_model import DEMO_MODEL_DIR
from tests.checkpoints import TOOL_CHAT_TEMPLATE

TEXTS = [
    "Hello world", " leading space", "two  spaces and trailing  ", "", " ", "\n", "line one\nline two\n\n\tindented",
    "Grüße aus 日本 🎉! Café naïve — ok.", "emoji 👩‍👩‍👧 and \u200b zero width", "<s>special</s> in text <pad>",
    "</s></s><s>", "<unk> and <|user|> and <|assistant|>", "don't I'm we're , . ? !", "x" * 300, "1234567890 3.14",
]

LLAMA2_STYLE_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}{% set messages = messages[1:] %}"
    "{% endif %}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + message['content'] | trim + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] | trim + ' ' + eos_token }}{% endif %}{% endfor %}"
)

FEATURES_TEMPLATE = (
    "{%- set ns = namespace(count=0) -%}\n"
    "{%- for message in messages -%}\n"
    "  {%- if message.role == 'skip' %}{% continue %}{% endif -%}\n"
    "  {%- set ns.count = ns.count + 1 -%}\n"
    "  {{ ns.count }}:{{ message.role }}={{ message | tojson }}\n"
    "  {%- if message.reasoning_content is defined %} think={{ message.reasoning_content }}{% endif %}\n"
    "  {%- generation %}[{{ message.content }}]{% endgeneration %}\n"
    "{%- endfor -%}\n"
    "{{ dict(a=1) | tojson }}{{ tools | tojson(indent=2) }}{{ documents | tojson }}{{ custom | default('none') }}\n"
    "{%- if add_generation_prompt %}<gen>{% endif %}"
)

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Café? <b>&</b>"},
     {"role": "assistant", "content": "Sure. ", "tool_calls": None}, {"role": "user", "content": "日本 🎉"}],
    [{"role": "user", "content": "Weather?"},
     {"role": "assistant", "content": None, "reasoning": "think first",
      "tool_calls": [{"type": "function", "function": {"name": "get", "arguments": {"city": "Zürich"}}}]},
     {"role": "tool", "content": "sunny"}, {"role": "skip", "content": "x"}],
]

TOOLS = [{"type": "function", "function": {"name": "get", "description": "Weather <now>", "parameters": {"type": "object"}}}]


def _checkpoint_like(src: Path, out: Path, model_type: str = "llama", **config_changes) -> Path:
    """``src``'s tokenizer files beside a minimal config.json (what AutoTokenizer consults)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"):
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    (out / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": ["LlamaForCausalLM"]}))
    if config_changes:
        config = json.loads((out / "tokenizer_config.json").read_text())
        config.update(config_changes)
        (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module", params=["llama2", "llama2_alone", "demo", "byte_bpe"])
def pair(request, tmp_path_factory, tokenizer_dir):
    out = tmp_path_factory.mktemp(request.param)
    if request.param == "llama2":
        src = request.getfixturevalue("llama2_tokenizer_dir")
        path = _checkpoint_like(src, out, chat_template=TOOL_CHAT_TEMPLATE.strip())
    elif request.param == "llama2_alone":  # a tokenizer directory without config.json
        path = request.getfixturevalue("llama2_tokenizer_dir")
    elif request.param == "demo":
        path = DEMO_MODEL_DIR
    else:
        path = _checkpoint_like(tokenizer_dir, out, model_type="qwen3")
    fast = load_tokenizer(path)
    assert isinstance(fast, FastTokenizer)
    return fast, load_transformers_tokenizer(path)


def test_backend_pipeline_is_transformers(pair):
    fast, hf = pair
    assert json.loads(fast.backend_tokenizer.to_str()) == json.loads(hf.backend_tokenizer.to_str())


def test_encode_matches(pair):
    fast, hf = pair
    for text in TEXTS:
        for add_special_tokens in (True, False):
            assert fast.encode(text, add_special_tokens=add_special_tokens) == hf.encode(
                text, add_special_tokens=add_special_tokens
            ), (text, add_special_tokens)
        assert fast.encode(text) == hf.encode(text)


def test_decode_matches(pair):
    fast, hf = pair
    for text in TEXTS:
        ids = hf.encode(text)
        for skip in (True, False):
            for clean_up in (None, True, False):
                got = fast.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=clean_up)
                assert got == hf.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=clean_up), text
        assert fast.decode(ids[:1]) == hf.decode(ids[:1])
        if ids:
            assert fast.decode(ids[0]) == hf.decode(ids[0])
    batch = [hf.encode(text) for text in TEXTS[:4]]
    assert fast.batch_decode(batch) == hf.batch_decode(batch) == fast.decode(batch)


def test_incremental_detokenization_matches(pair):
    fast, hf = pair
    prompt = hf.encode("Hello")
    for text in TEXTS:
        ids = hf.encode(text, add_special_tokens=False) + [hf.eos_token_id]
        for skip in (True, False):
            params = SamplingParams(max_tokens=len(ids), skip_special_tokens=skip)
            texts = []
            for tokenizer in (fast, hf):
                detokenizer = IncrementalDetokenizer(tokenizer, prompt, params)
                pieces = []
                for token_id in ids:
                    detokenizer.update([token_id], check_stop=False)
                    pieces.append(detokenizer.get_next_output_text(False, delta=True))
                texts.append(pieces)
            assert texts[0] == texts[1], text


def test_special_tokens_and_vocabulary_match(pair):
    fast, hf = pair
    for name in ("bos", "eos", "unk", "pad", "sep", "cls", "mask"):
        assert getattr(fast, f"{name}_token") == getattr(hf, f"{name}_token"), name
        assert getattr(fast, f"{name}_token_id") == getattr(hf, f"{name}_token_id"), name
    assert fast.special_tokens_map == hf.special_tokens_map
    assert fast.all_special_tokens == hf.all_special_tokens
    assert fast.all_special_ids == hf.all_special_ids
    assert fast.get_vocab() == hf.get_vocab() and len(fast) == len(hf) and fast.vocab_size == hf.vocab_size
    assert fast.get_added_vocab() == hf.get_added_vocab()
    assert {i: str(t) for i, t in fast.added_tokens_decoder.items()} == {i: str(t) for i, t in hf.added_tokens_decoder.items()}
    ids = list(range(min(len(hf), 600)))
    assert fast.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    assert fast.convert_ids_to_tokens(ids, skip_special_tokens=True) == hf.convert_ids_to_tokens(ids, skip_special_tokens=True)
    assert fast.convert_ids_to_tokens(5) == hf.convert_ids_to_tokens(5)
    tokens = hf.convert_ids_to_tokens(ids[:50]) + ["surely-not-a-token"]
    assert fast.convert_tokens_to_ids(tokens) == hf.convert_tokens_to_ids(tokens)
    for name in ("truncation_side", "model_max_length", "clean_up_tokenization_spaces", "chat_template"):
        assert getattr(fast, name) == getattr(hf, name), name


@pytest.mark.parametrize("template", [None, TOOL_CHAT_TEMPLATE.strip(), LLAMA2_STYLE_TEMPLATE, FEATURES_TEMPLATE])
def test_chat_template_matches(pair, template):
    fast, hf = pair
    if template is None and hf.chat_template is None:
        pytest.skip("no chat template of its own")
    for conversation in CONVERSATIONS:
        for kwargs in ({"add_generation_prompt": True}, {"add_generation_prompt": False}, {"tools": TOOLS, "custom": "c"},
                       {"documents": [{"title": "t", "text": "x"}], "enable_thinking": False}):
            results = []
            for tokenizer in (fast, hf):
                try:
                    results.append(tokenizer.apply_chat_template(conversation, chat_template=template, tokenize=False, **kwargs))
                except Exception as exc:  # the same refusal, with the same message
                    results.append((type(exc).__name__, str(exc)))
            assert results[0] == results[1], (conversation, kwargs)


def test_continue_final_message_matches(pair):
    fast, hf = pair
    conversation = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "one, two,  "}]
    for template in (TOOL_CHAT_TEMPLATE.strip(), LLAMA2_STYLE_TEMPLATE):
        got = fast.apply_chat_template(conversation, chat_template=template, tokenize=False, continue_final_message=True)
        assert got == hf.apply_chat_template(conversation, chat_template=template, tokenize=False, continue_final_message=True)
    with pytest.raises(ValueError):
        fast.apply_chat_template(conversation, chat_template=LLAMA2_STYLE_TEMPLATE, tokenize=False,
                                 continue_final_message=True, add_generation_prompt=True)


def test_set_chat_template_and_copies_stay_fast(pair):
    fast, hf = pair
    fast = copy.deepcopy(fast)
    fast.chat_template = LLAMA2_STYLE_TEMPLATE
    hf = copy.deepcopy(hf)
    hf.chat_template = LLAMA2_STYLE_TEMPLATE
    conversation = CONVERSATIONS[0]
    assert fast.apply_chat_template(conversation, tokenize=False) == hf.apply_chat_template(conversation, tokenize=False)
    assert fast._delegate is None  # nothing above needed transformers


def test_calls_it_does_not_mirror_go_to_transformers(pair):
    fast, hf = pair
    fast = copy.deepcopy(fast)
    texts = ["short", "a longer text with more words"]
    assert fast(texts)["input_ids"] == hf(texts)["input_ids"]
    assert fast.apply_chat_template(CONVERSATIONS[0], chat_template=LLAMA2_STYLE_TEMPLATE) == hf.apply_chat_template(
        CONVERSATIONS[0], chat_template=LLAMA2_STYLE_TEMPLATE
    )
    assert fast.tokenize("Hello world") == hf.tokenize("Hello world")  # an attribute it lacks
    # apply_chat_template's tokenizing options are transformers' parameters, not template variables.
    assert fast.apply_chat_template(CONVERSATIONS[0], chat_template=FEATURES_TEMPLATE, tokenize=False, return_dict=True) == (
        hf.apply_chat_template(CONVERSATIONS[0], chat_template=FEATURES_TEMPLATE, tokenize=False, return_dict=True)
    )
    assert transformers_tokenizer(fast) is fast._delegate and transformers_tokenizer(hf) is hf


def test_loading_does_not_import_transformers():
    code = (
        "import sys; from octavo.core.tokenizer import load_tokenizer; "
        f"t = load_tokenizer({str(DEMO_MODEL_DIR)!r}); t.decode(t.encode('Hi')); "
        "t.apply_chat_template([{'role': 'user', 'content': 'Hi'}], tokenize=False); "
        "import copy; copy.deepcopy(t); assert type(t).__name__ == 'FastTokenizer'; "
        "assert 'transformers' not in sys.modules, 'transformers was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _legacy_normalizer(path: Path) -> None:
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    tokenizer["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    tokenizer["pre_tokenizer"] = None
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))


@pytest.mark.parametrize(
    "case", ["unknown_key", "other_class", "mistral", "qwen2", "legacy_llama", "missing_special", "truncation"]
)
def test_unusual_files_load_with_transformers(case, tmp_path, llama2_tokenizer_dir):
    model_type = case if case in ("mistral", "qwen2") else "llama"
    path = _checkpoint_like(llama2_tokenizer_dir, tmp_path / case, model_type=model_type)
    config = json.loads((path / "tokenizer_config.json").read_text())
    if case == "unknown_key":
        config["some_new_option"] = True
    elif case == "other_class":
        config["tokenizer_class"] = "GPT2Tokenizer"
    elif case == "legacy_llama":
        _legacy_normalizer(path)
    elif case == "missing_special":
        config["pad_token"] = "<pad-not-added>"
    elif case == "truncation":
        tokenizer = json.loads((path / "tokenizer.json").read_text())
        tokenizer["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
        (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    from octavo.core.tokenizer_files import Unsupported, read_tokenizer_files

    with pytest.raises(Unsupported):
        read_tokenizer_files(path)
    if case != "other_class":  # transformers' GPT2Tokenizer refuses these files: nothing to compare
        assert not isinstance(load_tokenizer(path), FastTokenizer)


def test_model_types_keep_the_named_class():
    """AutoTokenizer's routing for the accepted model types, read from transformers'
    tables: no registered class, the generic one, or one the file's class wins over."""
    from transformers.models.auto.tokenization_auto import MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS as rerouted
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    from octavo.core.tokenizer_files import MODEL_TYPES

    for model_type in MODEL_TYPES:
        registered = TOKENIZER_MAPPING_NAMES.get(model_type)
        assert registered in (None, "TokenizersBackend") or model_type not in rerouted, model_type
        assert registered != "MistralCommonBackend", model_type


def test_qwen2_model_type_really_reroutes(tmp_path, tokenizer_dir):
    """Why qwen2 is left out: AutoTokenizer loads Qwen2Tokenizer whatever the file names."""
    path = _checkpoint_like(tokenizer_dir, tmp_path / "qwen2", model_type="qwen2")
    assert type(load_transformers_tokenizer(path)).__name__ == "Qwen2Tokenizer"


def test_legacy_llama_file_really_differs(tmp_path, llama2_tokenizer_dir):
    """Why a SentencePiece-style normalizer must not be read as it is: transformers 5
    rebuilds LlamaTokenizer's pipeline, and the tokens after a special token differ."""
    from tokenizers import Tokenizer

    path = _checkpoint_like(llama2_tokenizer_dir, tmp_path / "legacy")
    _legacy_normalizer(path)
    text = "</s>hello"
    raw = Tokenizer.from_file(str(path / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    assert raw != load_transformers_tokenizer(path).encode(text, add_special_tokens=False)


def test_fast_tokenizer_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("OCTAVO_FAST_TOKENIZER", "0")
    assert not isinstance(load_tokenizer(DEMO_MODEL_DIR), FastTokenizer)


@pytest.mark.parametrize(
    "changes",
    [{"add_bos_token": True, "add_eos_token": True}, {"clean_up_tokenization_spaces": True}, {"model_max_length": None}],
)
def test_config_options_match(tmp_path, tokenizer_dir, changes):
    """transformers ignores add_bos_token and add_eos_token where tokenizer.json exists (its
    post-processor decides), and skips the clean-up of spaces for BPE models."""
    path = _checkpoint_like(tokenizer_dir, tmp_path / "options", **changes)
    fast, hf = load_tokenizer(path), load_transformers_tokenizer(path)
    assert isinstance(fast, FastTokenizer)
    assert fast.model_max_length == hf.model_max_length
    for text in TEXTS:
        ids = hf.encode(text)
        assert fast.encode(text) == ids and fast.decode(ids) == hf.decode(ids), text


def test_wordpiece_clean_up_matches(tmp_path):
    """The clean-up of spaces applies to non-BPE models (here WordPiece), as in transformers."""
    from tokenizers import Tokenizer, decoders

    from tests.models.pooling_checkpoints import build_wordpiece_tokenizer

    src = build_wordpiece_tokenizer(tmp_path / "wordpiece")
    backend = Tokenizer.from_file(str(src / "tokenizer.json"))
    backend.add_special_tokens(["[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"])
    backend.decoder = decoders.WordPiece(cleanup=False)  # so that transformers' own clean-up shows
    backend.save(str(src / "tokenizer.json"))
    decoded = set()
    for clean_up in (True, False):
        path = _checkpoint_like(src, tmp_path / f"clean{clean_up}", clean_up_tokenization_spaces=clean_up)
        fast, hf = load_tokenizer(path), load_transformers_tokenizer(path)
        assert isinstance(fast, FastTokenizer)
        assert json.loads(fast.backend_tokenizer.to_str()) == json.loads(hf.backend_tokenizer.to_str())
        for text in ["the cat , the dog . ok ? yes !", "The Cat.", ""]:
            ids = hf.encode(text)
            assert fast.encode(text) == ids
            for skip in (True, False):
                assert fast.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text
        decoded.add(fast.decode(fast.encode("the cat , the dog .")))
    assert len(decoded) == 2
