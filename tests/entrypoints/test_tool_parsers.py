"""Tool-call and reasoning parsers: the same calls and text whether the
output arrives whole or a few characters at a time, and OpenAI's delta shape
(the first delta of a call has its id and name, later ones argument pieces)."""

from __future__ import annotations

import json
import random

import pytest

from octavo.entrypoints.openai.tool_parsers import TOOL_PARSERS


def parse(name: str, text: str, chunk: int | None = None, seed: int = 0):
    """(content, [(name, arguments)]) with the deltas checked for shape."""
    parser = TOOL_PARSERS[name]()
    rng = random.Random(seed)
    pieces, position = [], 0
    while position < len(text):
        size = len(text) if chunk is None else rng.randint(1, chunk)
        pieces.append(text[position : position + size])
        position += size
    deltas = [parser.feed(piece) for piece in pieces] + [parser.finish()]
    content = "".join(d.content for d in deltas)
    calls: dict[int, list] = {}
    for delta in (c for d in deltas for c in d.tool_calls):
        if delta.index not in calls:
            assert delta.id and delta.name, "a call's first delta names it"
            calls[delta.index] = [delta.name, delta.arguments]
        else:
            assert delta.id is None and delta.name is None
            calls[delta.index][1] += delta.arguments
    assert sorted(calls) == list(range(len(calls)))
    return content, [tuple(calls[i]) for i in sorted(calls)]


def same_whole_and_streamed(name: str, text: str):
    whole = parse(name, text)
    for seed in range(8):
        assert parse(name, text, chunk=3, seed=seed) == whole
    assert parse(name, text, chunk=1) == whole
    return whole


def test_hermes_calls_between_text():
    text = (
        'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n'
        '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {"tz": "a}\\"b"}}</tool_call> done'
    )
    content, calls = same_whole_and_streamed("hermes", text)
    assert content == "Let me check. \n done"
    assert [(n, json.loads(a)) for n, a in calls] == [
        ("get_weather", {"city": "Paris", "days": [1, 2]}),
        ("get_time", {"tz": 'a}"b'}),
    ]


def test_hermes_not_a_call_stays_text():
    text = "a <tool_call>not json</tool_call> b <tool_ca"
    assert same_whole_and_streamed("hermes", text) == (text, [])
    assert same_whole_and_streamed("hermes", 'x <tool_call>{"foo": 1}</tool_call>') == ('x <tool_call>{"foo": 1}</tool_call>', [])


def test_hermes_missing_end_tag_and_string_arguments():
    _, calls = same_whole_and_streamed("hermes", '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}')
    assert calls == [("f", '{"x": 1}')]
    _, calls = same_whole_and_streamed("hermes", '<tool_call>{"name": "f"}</tool_call>')
    assert calls == [("f", "{}")]
    # Cut off mid-arguments (max_tokens): the call keeps what arrived.
    _, calls = same_whole_and_streamed("hermes", '<tool_call>{"name": "f", "arguments": {"x": [1, 2')
    assert calls == [("f", '{"x": [1, 2')]


def test_llama3_json():
    text = '<|python_tag|>{"name": "a", "parameters": {"q": 1}}; {"name": "b", "parameters": {}}'
    assert same_whole_and_streamed("llama3_json", text) == ("", [("a", '{"q": 1}'), ("b", "{}")])
    assert same_whole_and_streamed("llama3_json", '  {"name": "a", "parameters": {"q": "x"}}') == ("", [("a", '{"q": "x"}')])
    assert same_whole_and_streamed("llama3_json", "Just text {not a call}") == ("Just text {not a call}", [])


def test_mistral_both_formats():
    text = 'Sure.[TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": "]"}}]'
    assert same_whole_and_streamed("mistral", text) == ("Sure.", [("a", '{"x": 1}'), ("b", '{"y": "]"}')])
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}[TOOL_CALLS]get_time[ARGS]{}'
    assert same_whole_and_streamed("mistral", text) == ("", [("get_weather", '{"city": "Rome"}'), ("get_time", "{}")])
    assert same_whole_and_streamed("mistral", "No calls [TOOL") == ("No calls [TOOL", [])


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_plain_text_passes_through(name):
    text = "Hello, world: nothing to call here."
    assert same_whole_and_streamed(name, text) == (text, [])


def split_reasoning(name: str, text: str, chunk: int | None = None, seed: int = 0) -> tuple[str, str]:
    from octavo.entrypoints.openai.reasoning import REASONING_PARSERS

    parser = REASONING_PARSERS[name]()
    rng = random.Random(seed)
    parts, position = [], 0
    while position < len(text):
        size = len(text) if chunk is None else rng.randint(1, chunk)
        parts.append(parser.feed(text[position : position + size]))
        position += size
    parts.append(parser.finish())
    return "".join(r for r, _ in parts), "".join(c for _, c in parts)


@pytest.mark.parametrize(
    "name, text, expected",
    [
        ("qwen3", "<think>\nsteps 1<2\n</think>\n\nThe answer.", ("\nsteps 1<2\n", "The answer.")),
        ("qwen3", "The answer, no thinking.", ("", "The answer, no thinking.")),
        ("qwen3", "<think>cut off by max_tok", ("cut off by max_tok", "")),
        ("deepseek_r1", "reasoning here</think>answer", ("reasoning here", "answer")),
        ("deepseek_r1", "<think>reasoning</think>\n\nanswer </think>", ("reasoning", "answer </think>")),
        ("deepseek_r1", "all reasoning", ("all reasoning", "")),
        ("mistral", "[THINK]a [b] c[/THINK]\nAnswer.", ("a [b] c", "Answer.")),
        ("mistral", "No thinking [THINK] here.", ("", "No thinking [THINK] here.")),
        ("granite", "Here is my thought process:\nI think.\nHere is my response:\nAnswer.", ("\nI think.\n", "Answer.")),
        ("granite", "Here's my thought process: x. Here's my response: y", (" x. ", " y")),
        ("granite", "Here is my answer.", ("", "Here is my answer.")),
        ("seed_oss", "<seed:think>a<seed:cot_budget_reflect>used 9</seed:cot_budget_reflect>b</seed:think>\nAnswer.",
         ("a<seed:cot_budget_reflect>used 9</seed:cot_budget_reflect>b", "Answer.")),
        ("seed_oss", "Answer, <think>no</think> thinking.", ("", "Answer, <think>no</think> thinking.")),
        ("olmo3", "<think>plan</think>\n\nAnswer.", ("plan", "Answer.")),
        ("olmo3", "opened by the template</think>Answer.", ("opened by the template", "Answer.")),
    ],
)
def test_reasoning_split(name, text, expected):
    assert split_reasoning(name, text) == expected
    for seed in range(6):
        assert split_reasoning(name, text, chunk=3, seed=seed) == expected


def shaped(shaper, pieces):
    from octavo.entrypoints.openai.chat_output import ChoiceMessage

    message = ChoiceMessage()
    for piece in pieces:
        message.add(shaper.feed(piece))
    message.add(shaper.finish())
    return message


def test_shaper_keeps_the_eos_text_out_when_special_tokens_are_kept():
    from octavo.entrypoints.openai.chat_output import OutputShaper

    shaper = OutputShaper(None, TOOL_PARSERS["mistral"](), hidden_suffixes=("</s>",))
    message = shaped(shaper, ['Sure.[TOOL_CALLS][{"name": "a", ', '"arguments": {}}]</s>'])
    assert message.content == "Sure." and [(c.name, c.arguments) for c in message.tool_calls] == [("a", "{}")]
    assert shaper.finish_reason("stop") == "tool_calls" and shaper.finish_reason("length") == "length"


def test_grammar_enforced_calls_are_read_back():
    from octavo.entrypoints.openai.chat_output import NamedCallReader, OutputShaper, RequiredCallsReader, openai_delta

    text = '[{"name": "f", "parameters": {"x": [1, {"y": "]}"}]}}, {"name": "g", "parameters": {}}]'
    message = shaped(OutputShaper(None, RequiredCallsReader()), [text[i : i + 4] for i in range(0, len(text), 4)])
    assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == [("f", {"x": [1, {"y": "]}"}]}), ("g", {})]
    assert message.content == ""
    # Without parallel calls only the first is kept; a named choice's output is the arguments.
    assert len(shaped(OutputShaper(None, RequiredCallsReader(), parallel_tool_calls=False), [text]).tool_calls) == 1
    shaper = OutputShaper(None, NamedCallReader("h"))
    first = shaper.feed('{"a": ')
    assert openai_delta(first) == {"tool_calls": [
        {"index": 0, "id": first.tool_calls[0].id, "type": "function", "function": {"name": "h", "arguments": '{"a": '}}
    ]}
    assert openai_delta(shaper.feed("1}")) == {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}


def test_granite_and_phi4_mini_arrays():
    text = 'Checking.<|tool_call|>[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]'
    assert same_whole_and_streamed("granite", text) == ("Checking.", [("a", '{"x": 1}'), ("b", "{}")])
    text = '<tool_call>[{"name": "a", "arguments": {"x": "]"}}] after'
    assert same_whole_and_streamed("granite", text) == ("after", [("a", '{"x": "]"}')])  # spaces after the calls go
    text = 'functools[{"name": "get_time", "arguments": {"zone": "utc"}}]'
    assert same_whole_and_streamed("phi4_mini_json", text) == ("", [("get_time", '{"zone": "utc"}')])


def test_pythonic_calls_and_text():
    text = '[get_weather(city="Paris", days=[1, 2]), tools.get_time(zone=\'utc\', exact=True), noop()]'
    content, calls = same_whole_and_streamed("pythonic", text)
    assert content == "" and [(n, json.loads(a)) for n, a in calls] == [
        ("get_weather", {"city": "Paris", "days": [1, 2]}), ("tools.get_time", {"zone": "utc", "exact": True}),
        ("noop", {}),
    ]
    text = '<|python_start|>[f(x="a]b")]<|python_end|> done'
    assert same_whole_and_streamed("llama4_pythonic", text) == (" done", [("f", '{"x": "a]b"}')])
    for plain in ("[1, 2] is a list", "[f(1)]", "[f(x=open('y'))]", "[unclosed(x=1)", "Hello [f(x=1)]"):
        assert same_whole_and_streamed("pythonic", plain) == (plain, [])


def test_deepseek_v3_and_v31():
    call = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>"
    text = f"Sure.<｜tool▁calls▁begin｜>{call}\n{call}<｜tool▁calls▁end｜> ok"
    assert same_whole_and_streamed("deepseek_v3", text) == ("Sure. ok", [("get_weather", '{"city": "Paris"}')] * 2)
    text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"zone\": \"utc\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    assert same_whole_and_streamed("deepseek_v31", text) == ("", [("get_time", '{"zone": "utc"}')])
    # Cut off inside a call: it keeps what arrived.
    text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"zone\": "
    assert same_whole_and_streamed("deepseek_v31", text) == ("", [("get_time", '{"zone":')])


def test_a_reasoning_parser_that_reads_special_tokens_keeps_them():
    from octavo.entrypoints.openai.chat_features import ChatFeatures

    assert ChatFeatures(reasoning_parser="mistral").skip_special_tokens is False
    assert ChatFeatures(reasoning_parser="qwen3").skip_special_tokens is None


QWEN3_CODER_CALL = (
    "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n007 Paris\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"unit\": \"c\"}\n</parameter>\n</function>\n</tool_call>\n"
)


def test_qwen3_coder_xml_calls_typed_by_the_schema():
    from octavo.entrypoints.openai.tool_parsers.qwen3_coder import Qwen3CoderToolParser
    from octavo.entrypoints.openai.tools import Tool

    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                               "opts": {"type": "object"}}}
    content, calls = same_whole_and_streamed("qwen3_coder", QWEN3_CODER_CALL + "Done.")
    assert content == "Let me check.\nDone." and [(n, json.loads(a)) for n, a in calls] == [
        ("get_weather", {"city": "007 Paris", "days": 3, "opts": {"unit": "c"}})]
    parser = Qwen3CoderToolParser([Tool("get_weather", None, schema)])
    delta = parser.feed(QWEN3_CODER_CALL.replace("007 Paris", "42"))
    delta.extend(parser.finish())
    assert json.loads(delta.tool_calls[0].arguments) == {"city": "42", "days": 3, "opts": {"unit": "c"}}
    # Not a function inside: text. Cut off inside a call: what arrived.
    assert same_whole_and_streamed("qwen3_coder", "<tool_call>oops</tool_call>") == ("<tool_call>oops</tool_call>", [])
    _, calls = same_whole_and_streamed("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\nx")
    assert calls == [("f", '{"a": "x"}')]


def test_seed_oss_calls_between_its_own_tags():
    from octavo.entrypoints.openai.chat_features import ChatFeatures

    seed_call = QWEN3_CODER_CALL.replace("<tool_call>", "<seed:tool_call>").replace("</tool_call>", "</seed:tool_call>")
    content, calls = same_whole_and_streamed("seed_oss", seed_call + "Done.")
    assert content == "Let me check.\nDone." and [(n, json.loads(a)) for n, a in calls] == [
        ("get_weather", {"city": "007 Paris", "days": 3, "opts": {"unit": "c"}})]
    # Qwen3-Coder's own tags are text to it.
    assert same_whole_and_streamed("seed_oss", QWEN3_CODER_CALL) == (QWEN3_CODER_CALL, [])
    assert ChatFeatures(reasoning_parser="seed_oss").skip_special_tokens is False


def test_kimi_k2_calls_keep_their_ids():
    from octavo.entrypoints.openai.tool_parsers import TOOL_PARSERS

    text = (
        "Let me look.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
        "<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|>"
        "<|tool_calls_section_end|>"
    )
    content, calls = same_whole_and_streamed("kimi_k2", text)
    assert content == "Let me look." and calls == [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]
    parser = TOOL_PARSERS["kimi_k2"]()
    delta = parser.feed(text)
    delta.extend(parser.finish())
    assert [c.id for c in delta.tool_calls] == ["functions.get_weather:0", "functions.get_time:1"]
    assert TOOL_PARSERS["kimi_k2"].needs_special_tokens


def test_glm45_calls_typed_by_the_schema():
    from octavo.entrypoints.openai.tools import Tool

    text = (
        "Checking.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>007 Paris</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{\"unit\": \"c\"}"
        "</arg_value>\n</tool_call>\n<tool_call>get_time\n</tool_call>"
    )
    content, calls = same_whole_and_streamed("glm45", text)
    assert content == "Checking." and [(n, json.loads(a)) for n, a in calls] == [
        ("get_weather", {"city": "007 Paris", "days": 3, "opts": {"unit": "c"}}), ("get_time", {})]
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    parser = TOOL_PARSERS["glm45"]([Tool("get_weather", None, schema)])
    delta = parser.feed(text.replace("007 Paris", "42"))
    delta.extend(parser.finish())
    assert json.loads(delta.tool_calls[0].arguments)["city"] == "42"
    assert same_whole_and_streamed("glm45", "<tool_call>not a call</tool_call>")[1] == []
    assert split_reasoning("glm45", "<think>plan</think>\nAnswer.") == ("plan", "Answer.")


def test_olmo3_calls_one_per_line():
    text = (
        'Checking.\n<function_calls>\nget_weather(city="Paris", days=3, opts={"unit": "c"})\n'
        "get_time(zone=null, dst=true)\n</function_calls>"
    )
    content, calls = same_whole_and_streamed("olmo3", text)
    assert content == "Checking.\n" and [(n, json.loads(a)) for n, a in calls] == [
        ("get_weather", {"city": "Paris", "days": 3, "opts": {"unit": "c"}}),
        ("get_time", {"zone": None, "dst": True}),
    ]
    # Lines that are not calls are text; so is a block cut off before its calls parse.
    not_calls = "<function_calls>\nhello there\n</function_calls> ok"
    assert same_whole_and_streamed("olmo3", not_calls) == (not_calls, [])
    assert same_whole_and_streamed("olmo3", "<function_calls>\nf(a=1)\ng(b=")[1] == []
    assert same_whole_and_streamed("olmo3", "<function_calls>\nf(a=1)\n") == ("", [("f", '{"a": 1}')])


def test_schema_typed_parsers_get_the_requests_tools():
    from octavo.entrypoints.openai.chat_output import tool_reader_factory
    from octavo.entrypoints.openai.tools import Tool, ToolUse

    use = ToolUse(tools=[Tool("f", None, {"type": "object", "properties": {"n": {"type": "string"}}})], mode="auto")
    parser = tool_reader_factory(use, "qwen3_coder")()
    delta = parser.feed("<tool_call>\n<function=f>\n<parameter=n>\n12\n</parameter>\n</function>\n</tool_call>")
    assert json.loads(delta.tool_calls[0].arguments) == {"n": "12"}


def test_a_constraint_waits_for_reasoning_where_the_tags_are_single_tokens():
    from octavo.core.structured_output.params import StructuredOutputsParams
    from octavo.entrypoints.openai.chat_features import ChatFeatures
    from octavo.entrypoints.openai.tools import ToolUse

    class Tokenizer:
        def __init__(self, vocab):
            self.vocab = vocab

        def encode(self, text, add_special_tokens=False):
            return self.vocab[text]

    single = Tokenizer({"<think>": [7], "</think>": [8]})
    features = ChatFeatures(constraint=StructuredOutputsParams(json_object=True), reasoning_parser="deepseek_r1")
    features.constrain_after_reasoning(single)
    c = features.constraint
    assert (c.reasoning_start_id, c.reasoning_end_id, c.starts_in_reasoning, c.json_object) == (7, 8, True, True)
    split = Tokenizer({"<think>": [1, 2], "</think>": [3, 4]})  # not single tokens: the constraint holds from the start
    features = ChatFeatures(constraint=StructuredOutputsParams(json_object=True), reasoning_parser="qwen3")
    features.constrain_after_reasoning(split)
    assert features.constraint.reasoning_start_id is None
    named = ChatFeatures(tool_use=ToolUse(mode="named", name="f"), constraint=StructuredOutputsParams(json_object=True),
                         reasoning_parser="qwen3")
    named.constrain_after_reasoning(single)  # a grammar-enforced call has no room for reasoning
    assert named.constraint.reasoning_start_id is None


def test_deepseek_v3_reasoning_follows_the_thinking_variable():
    """DeepSeek V3.1's hybrid template: reasoning (R1's way) only where the request's ``thinking`` is true."""
    from octavo.entrypoints.openai.chat_features import ChatFeatures
    from octavo.entrypoints.openai.reasoning import reasoning_parser_class

    def split(template_kwargs, text):
        parser = reasoning_parser_class("deepseek_v3", template_kwargs)()
        parts = [parser.feed(text[:5]), parser.feed(text[5:]), parser.finish()]
        return "".join(r for r, _ in parts), "".join(c for _, c in parts)

    assert split({"thinking": True}, "plan it</think>\n\nThe answer.") == ("plan it", "The answer.")
    assert split({}, "The answer, no thinking.") == ("", "The answer, no thinking.")
    assert split({"thinking": False}, "a </think> b") == ("", "a </think> b")
    features = ChatFeatures(reasoning_parser="deepseek_v3", template_kwargs={"thinking": False})
    assert features.shaper() is not None


DEEP = "[" * 3000 + "]" * 3000


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_model_output_nested_past_the_recursion_limit_is_read_without_error(name):
    """A model's output is anyone's (a prompt can steer it): arguments nested
    deeper than Python's JSON parser recurses stay text, whole or streamed."""
    payloads = [
        '<tool_call>{"name": "f", "arguments": ' + DEEP + "}</tool_call>",
        "<tool_call>\n<function=f>\n<parameter=a>\n" + DEEP + "\n</parameter>\n</function>\n</tool_call>",
        "<seed:tool_call>\n<function=f>\n<parameter=a>\n" + DEEP + "\n</parameter>\n</function>\n</seed:tool_call>",
        "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>" + DEEP + "</arg_value>\n</tool_call>",
        "[TOOL_CALLS][" + DEEP + "]",
        "[f(a=" + DEEP + ")]",
    ]
    for payload in payloads:
        parse(name, payload)
        parse(name, payload, chunk=97)
