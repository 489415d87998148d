"""gpt-oss's harmony output read by the ``openai_gptoss`` reasoning parser and
the ``openai`` tool parser: on text (whole, or a few characters at a time),
on token streams from a tokenizer whose markers are special tokens (decoded
as the engine decodes them), and the server-side switches: special tokens
kept where these parsers read, EOS texts out of the answer, names accepted."""

from __future__ import annotations

import random

import pytest

from octavo.core.sampling_params import SamplingParams
from octavo.entrypoints.openai.chat_features import ChatFeatures, check_parser_names
from octavo.entrypoints.openai.chat_output import ChoiceMessage, OutputShaper, openai_delta
from octavo.entrypoints.openai.tool_parsers.harmony_format import Header, parse_header
from octavo.entrypoints.openai.reasoning import REASONING_PARSERS
from octavo.entrypoints.openai.tool_parsers import TOOL_PARSERS
from octavo.entrypoints.openai.tools import ToolUse
from octavo.errors import InvalidArgumentError
from tests.entrypoints import test_tool_parsers as shared
from tests.harmony_checkpoint import build_harmony_tokenizer

CALL_WEATHER = ("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
                '<|message|>{"city": "Paris"}<|call|>')
CALL_TIME = "<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|> {} \n<|call|>"
ANSWER = (
    "<|channel|>analysis<|message|>The user wants the weather; 1 < 2.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
    + CALL_WEATHER + CALL_TIME
    + "<|start|>assistant<|channel|>final<|message|>Sunny, <b>21</b> C.<|return|>"
)
EOS_TEXTS = ("<|return|>", "</s>", "<|call|>")


def pieces_of(text: str, chunk: int | None, seed: int = 0) -> list[str]:
    rng, pieces, position = random.Random(seed), [], 0
    while position < len(text):
        size = len(text) if chunk is None else rng.randint(1, chunk)
        pieces.append(text[position : position + size])
        position += size
    return pieces


def shaper(reasoning: bool = True, tools: bool = True) -> OutputShaper:
    return OutputShaper(REASONING_PARSERS["openai_gptoss"]() if reasoning else None,
                        TOOL_PARSERS["openai"]() if tools else None, hidden_suffixes=EOS_TEXTS)


def read(pieces: list[str], reasoning: bool = True, tools: bool = True):
    """(reasoning, content, [(name, arguments)]) with each call's deltas checked for OpenAI's shape."""
    out, message, chunks = shaper(reasoning, tools), ChoiceMessage(), []
    for piece in pieces:
        delta = out.feed(piece)
        message.add(delta)
        chunks.append(openai_delta(delta))
    message.add(last := out.finish())
    chunks.append(openai_delta(last))
    seen: set[int] = set()
    for call in (call for chunk in chunks for call in chunk.get("tool_calls", [])):
        first = call["index"] not in seen
        assert ("id" in call and call["function"]["name"]) if first else ("id" not in call and "name" not in call["function"])
        seen.add(call["index"])
    assert not any(marker in text for text in (message.reasoning, message.content) for marker in ("<|", "|>"))
    return message.reasoning, message.content, [(call.name, call.arguments) for call in message.tool_calls]


def same_whole_and_streamed(text: str, reasoning: bool = True, tools: bool = True):
    whole = read([text], reasoning, tools)
    for seed in range(6):
        assert read(pieces_of(text, 4, seed), reasoning, tools) == whole
    assert read(pieces_of(text, 1), reasoning, tools) == whole
    return whole


CALLS = [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]


def test_channels_become_reasoning_content_and_calls():
    reasoning, content, calls = same_whole_and_streamed(ANSWER)
    assert reasoning == "The user wants the weather; 1 < 2."
    assert content == "Checking.Sunny, <b>21</b> C."  # the preamble and the answer
    assert calls == CALLS


def test_either_parser_alone():
    # The reasoning parser alone: no calls, and the messages to tools are not content.
    assert same_whole_and_streamed(ANSWER, tools=False) == (
        "The user wants the weather; 1 < 2.", "Checking.Sunny, <b>21</b> C.", [])
    # The tool parser alone: the reasoning is dropped (as vLLM drops it), never shown as content.
    assert same_whole_and_streamed(ANSWER, reasoning=False) == ("", "Checking.Sunny, <b>21</b> C.", CALLS)


def test_an_answer_that_ends_by_calling_a_tool():
    # <|call|> is an EOS token: the output ends with it (or without it, where the engine cut it).
    text = "<|channel|>analysis<|message|>Need data.<|end|>" + CALL_WEATHER
    assert same_whole_and_streamed(text) == ("Need data.", "", CALLS[:1])
    assert same_whole_and_streamed(text.removesuffix("<|call|>")) == ("Need data.", "", CALLS[:1])
    assert shaper().finish_reason("stop") == "stop"
    out = shaper()
    out.feed(text)
    out.finish()
    assert out.finish_reason("stop") == "tool_calls" and out.finish_reason("length") == "length"


def test_cut_off_answers_keep_what_arrived():
    assert same_whole_and_streamed("<|channel|>analysis<|message|>Still thin") == ("Still thin", "", [])
    assert same_whole_and_streamed("<|channel|>final<|message|>Hel") == ("", "Hel", [])
    # A call cut inside its arguments keeps them; a header cut short is markup, dropped.
    cut = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Pa"
    assert same_whole_and_streamed(cut) == ("", "", [("get_weather", '{"city": "Pa')])
    assert same_whole_and_streamed("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|chan") == ("x", "", [])


def test_output_that_is_not_harmony_is_plain_content():
    for text in ("Hello, world: nothing to call here.", "to be or not", '{"a": 1}', "<b>bold</b>"):
        assert same_whole_and_streamed(text) == ("", text, [])
        assert same_whole_and_streamed(text, reasoning=False) == ("", text, [])
    # The tool parser on its own, through the other parsers' checks.
    assert shared.same_whole_and_streamed("openai", "No markers at all.") == ("No markers at all.", [])
    assert shared.same_whole_and_streamed("openai", ANSWER) == ("Checking.Sunny, <b>21</b> C.", CALLS)


def test_built_in_tools_and_empty_messages():
    text = ("<|channel|>analysis to=browser.search <|constrain|>json<|message|>{\"query\": \"x\"}<|call|>"
            "<|start|>assistant<|channel|>final<|message|><|return|>")
    assert same_whole_and_streamed(text) == ("", "", [])
    assert same_whole_and_streamed("<|channel|>final<|message|>a<|end|>\n<|start|>assistant<|channel|>final<|message|>b") == (
        "", "ab", [])


@pytest.mark.parametrize("header, expected", [
    ("<|channel|>analysis<|message|>", Header("analysis")),
    ("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>", Header("commentary", "functions.get_weather")),
    ("<|start|>assistant to=functions.f<|channel|>commentary json<|message|>", Header("commentary", "functions.f")),
    (" to=python<|channel|>analysis code<|message|>", Header("analysis", "python")),
    ("<|start|>assistant<|message|>", Header()),
])
def test_headers(header, expected):
    assert parse_header(header) == expected
    assert expected.function == ("get_weather" if "get_weather" in header else "f" if "functions.f" in header else None)


def test_the_reasoning_parser_on_its_own_interface():
    expected = ("The user wants the weather; 1 < 2.", "Checking.Sunny, <b>21</b> C.")
    # Its EOS text (kept by the shaper in a server) is markup here as well.
    assert shared.split_reasoning("openai_gptoss", ANSWER) == expected
    assert shared.split_reasoning("openai_gptoss", ANSWER, chunk=3, seed=1) == expected


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from octavo.core.tokenizer import load_tokenizer

    return load_tokenizer(build_harmony_tokenizer(tmp_path_factory.mktemp("harmony-tokenizer")))


def detokenized(tokenizer, text: str, skip_special_tokens: bool) -> list[str]:
    """The pieces the engine's detokenizer hands out, one per token."""
    from octavo.core.detokenizer import IncrementalDetokenizer

    ids = tokenizer.encode(text, add_special_tokens=False)
    prompt = tokenizer.encode("<|start|>user<|message|>Weather?<|end|><|start|>assistant", add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer, prompt, SamplingParams(skip_special_tokens=skip_special_tokens))
    pieces = []
    for token_id in ids:
        before = len(detokenizer.output_text)
        detokenizer.update([token_id], check_stop=False)
        pieces.append(detokenizer.output_text[before:])
    return pieces


def test_token_streams_read_as_the_text(tokenizer):
    pieces = detokenized(tokenizer, ANSWER, skip_special_tokens=False)
    assert "".join(pieces) == ANSWER and "<|channel|>" in pieces  # the markers are single special tokens
    assert read(pieces) == read([ANSWER]) == ("The user wants the weather; 1 < 2.", "Checking.Sunny, <b>21</b> C.", CALLS)
    # Skipped special tokens leave nothing to read the channels by: why the parsers keep them.
    assert "".join(detokenized(tokenizer, ANSWER, skip_special_tokens=True)).startswith("analysisThe user")


def test_the_parsers_keep_special_tokens_and_nothing_else_changes(tokenizer):
    assert ChatFeatures(reasoning_parser="openai_gptoss").skip_special_tokens is False
    assert ChatFeatures(tool_use=ToolUse(mode="auto"), tool_parser="openai").skip_special_tokens is False
    assert ChatFeatures(tool_use=ToolUse(mode="none"), tool_parser="openai").skip_special_tokens is None
    assert ChatFeatures(tool_use=ToolUse(mode="auto"), tool_parser="hermes", reasoning_parser="qwen3").skip_special_tokens is None
    features = ChatFeatures(tool_use=ToolUse(mode="auto"), tool_parser="openai", reasoning_parser="openai_gptoss")
    eos_ids = frozenset(tokenizer.convert_tokens_to_ids(["<|return|>", "</s>", "<|call|>"]))
    features.keep_special_tokens_for(tokenizer, eos_ids)
    assert sorted(features.eos_texts) == sorted(EOS_TEXTS)
    shaped = features.shaper()
    assert shaped.reasoning.forward_messages  # the tool parser reads the messages behind it
    assert not ChatFeatures(reasoning_parser="openai_gptoss").shaper().reasoning.forward_messages


def test_an_output_constraint_holds_from_the_first_token(tokenizer):
    from octavo.core.structured_output.params import StructuredOutputsParams

    constraint = StructuredOutputsParams(json_object=True)
    features = ChatFeatures(constraint=constraint, reasoning_parser="openai_gptoss")
    features.constrain_after_reasoning(tokenizer)  # harmony's reasoning markers are several tokens
    assert features.constraint is constraint


def test_the_names_are_accepted():
    from octavo.entrypoints.cli import serve
    from tests.entrypoints.server.test_serve_cli import parse

    check_parser_names("openai", "openai_gptoss")
    with pytest.raises(InvalidArgumentError, match="openai_gptoss"):  # the known names are listed
        check_parser_names(None, "gptoss")
    args = parse(["--reasoning-parser", "openai_gptoss", "--tool-call-parser", "openai", "--enable-auto-tool-choice"])
    config = serve.server_config_from(args)
    assert (config.reasoning_parser, config.tool_call_parser, config.enable_auto_tool_choice) == ("openai_gptoss", "openai", True)
