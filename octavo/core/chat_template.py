"""Chat templates rendered with jinja2 as transformers 5 renders them, without
importing transformers (see ``octavo.core.fast_tokenizer``).

What the template sees, as in ``apply_chat_template(..., tokenize=False)``:
the messages (keys whose value is None dropped, the reasoning copied under
``reasoning_content`` and ``thinking``), ``tools``, ``documents``,
``add_generation_prompt``, the named special tokens (``bos_token``,
``eos_token``, ...) and the caller's keyword arguments (which win over the
special tokens). The environment is sandboxed and immutable, trims blocks,
and offers ``raise_exception``, ``strftime_now``, a ``tojson`` that does not
escape HTML, loop controls and the ``{% generation %}`` block.

Only plain JSON-like values reach the template (dicts, lists, strings,
numbers, booleans, None); anything else is refused with ``UnsupportedChatInput`` so
that the caller can hand the call to transformers.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class UnsupportedChatInput(Exception):
    """An input the renderer does not mirror (the caller asks transformers instead)."""


def _plain(value: Any) -> Any:
    """A copy made of plain JSON types (the template may change nothing of the caller's)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if type(value) is dict:
        return {_plain(key): _plain(item) for key, item in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_plain(item) for item in value)
    raise UnsupportedChatInput(f"a {type(value).__name__} in the chat")


def _messages(conversation: list) -> list[dict]:
    messages = []
    for message in _plain(list(conversation)):
        if not isinstance(message, dict):
            raise TypeError(f"Chat messages should be dicts, but got {message!r}.")
        message = {key: value for key, value in message.items() if value is not None}
        reasoning = next((message[key] for key in REASONING_FIELDS if message.get(key) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        messages.append(message)
    return messages


@lru_cache(maxsize=16)
def compile_template(source: str):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if tuple(int(part) for part in jinja2.__version__.split(".")[:3] if part.isdigit()) < (3, 1, 6):
        # transformers refuses older versions (known sandbox escapes); so does this path
        raise UnsupportedChatInput(f"jinja2 {jinja2.__version__} is older than 3.1.6")

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` renders its body (the
        assistant-mask bookkeeping transformers adds is not needed for text)."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class Namespace(jinja2.utils.Namespace):
        """Refuses underscore attributes, which could reach the interpreter's internals."""

        def __init__(*args, **kwargs):
            self, attrs = args[0], dict(*args[1:], **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template may not set {name!r} on a namespace")

    class Dicts:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals.update(
        raise_exception=raise_exception,
        strftime_now=lambda fmt: datetime.now().strftime(fmt),
        dict=Dicts(),
        namespace=Namespace,
    )
    return env.from_string(source)


def render_chat(
    template: str,
    conversation: list,
    special_tokens: dict[str, str],
    tools: list | None = None,
    documents: list | None = None,
    add_generation_prompt: bool = False,
    continue_final_message: bool | str = False,
    **kwargs: Any,
) -> str:
    """The text of one conversation (transformers' ``tokenize=False`` result)."""
    if not conversation:
        raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt are not compatible.")
    if tools is not None and not all(isinstance(tool, dict) for tool in tools):
        raise UnsupportedChatInput("tools given as functions")
    if documents is not None and not all(isinstance(doc, dict) for doc in documents):
        raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
    messages = _messages(conversation)
    variables = {**special_tokens, **_plain(kwargs)}
    final = _tag_final_message(template, messages, continue_final_message) if continue_final_message else None
    text = compile_template(template).render(
        messages=messages, tools=_plain(tools), documents=_plain(documents),
        add_generation_prompt=add_generation_prompt, **variables,
    )
    return _cut_at_tag(text, final) if final is not None else text


def _tag_final_message(template: str, messages: list[dict], which: bool | str) -> str:
    """Mark the end of the last message, so the text can be cut there (the message stays open)."""
    field = which if isinstance(which, str) else "content"
    final = messages[-1].get(field)
    if final is None:
        raise ValueError(f'continue_final_message is set but the final message has no "{field}" to continue!')
    fields = [field]
    if field in REASONING_FIELDS:
        fields = [name for name in REASONING_FIELDS if messages[-1].get(name) == final]
    if not any(name in template for name in fields):
        raise ValueError(
            f'continue_final_message is set to "{field}" but this is not an accepted field in the chat_template'
        )
    if not isinstance(final, str):
        raise UnsupportedChatInput("continuing a message made of content blocks")
    for name in fields:
        messages[-1][name] = messages[-1][name] + _CONTINUE_TAG
    return final


def _cut_at_tag(text: str, final: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise ValueError(
            "continue_final_message is set but the final message does not appear in the chat after applying the "
            "chat template!"
        )
    at = text.rindex(tag)
    if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()
