"""What a chat request asks of the output beyond sampling: tools and how they
may be called, an output constraint, template variables, and how the text is
read back (reasoning and tool-call parsers). Shared by the OpenAI chat route
and the Anthropic messages route, which build it from their own fields.

A tool choice that is enforced by grammar (``required``, named) and an
explicit output constraint (``response_format`` ...) cannot both hold: 400.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from octavo.core.structured_output.params import StructuredOutputsParams
from octavo.entrypoints.openai.chat_output import OutputShaper, tool_reader_factory
from octavo.entrypoints.openai.config import ServerConfig
from octavo.entrypoints.openai.conversation import template_kwargs
from octavo.entrypoints.openai.reasoning import REASONING_PARSERS, reasoning_parser_class
from octavo.entrypoints.openai.structured import constraint_from_request
from octavo.entrypoints.openai.tool_parsers import TOOL_PARSERS
from octavo.entrypoints.openai.tools import ToolUse, parse_tools, resolve_tool_choice
from octavo.errors import InvalidArgumentError


@dataclass
class ChatFeatures:
    tool_use: ToolUse = field(default_factory=ToolUse)
    constraint: StructuredOutputsParams | None = None
    constraint_param: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    reasoning_parser: str | None = None
    tool_parser: str | None = None
    # EOS texts to keep out of the content when special tokens are kept (see skip_special_tokens).
    eos_texts: tuple[str, ...] = ()

    @property
    def skip_special_tokens(self) -> bool | None:
        """False when a parser reads markers that are special tokens (None: no opinion)."""
        # Only a --tool-call-parser reads markers; the grammar-enforced readers read plain JSON.
        if self.tool_use.mode == "auto" and self.tool_parser and TOOL_PARSERS[self.tool_parser].needs_special_tokens:
            return False
        if self.reasoning_parser and getattr(REASONING_PARSERS[self.reasoning_parser], "needs_special_tokens", False):
            return False
        return None

    def shaper(self) -> OutputShaper:
        reasoning = reasoning_parser_class(self.reasoning_parser, self.template_kwargs)() if self.reasoning_parser else None
        # A grammar-enforced call has no room for reasoning.
        if self.tool_use.mode in ("required", "named"):
            reasoning = None
        factory = tool_reader_factory(self.tool_use, self.tool_parser)
        return OutputShaper(reasoning, factory() if factory else None, self.tool_use.parallel, self.eos_texts)

    def keep_special_tokens_for(self, tokenizer: Any, eos_token_ids: frozenset[int]) -> None:
        """Where a parser reads special tokens, the EOS token's text must not reach the content;
        and an output constraint waits for the model's reasoning to end (``constrain_after_reasoning``)."""
        if self.skip_special_tokens is False and tokenizer is not None:
            self.eos_texts = tuple(tokenizer.convert_ids_to_tokens(sorted(eos_token_ids)))
        self.constrain_after_reasoning(tokenizer)

    def constrain_after_reasoning(self, tokenizer: Any) -> None:
        """With a reasoning parser, a constraint the request asked for (not a grammar-enforced tool
        call, which leaves no room for reasoning) holds after the think block, where the parser's
        tags are single tokens; otherwise from the first token, as before."""
        if self.constraint is None or self.reasoning_parser is None or tokenizer is None:
            return
        if self.tool_use.mode in ("required", "named"):
            return
        parser = reasoning_parser_class(self.reasoning_parser, self.template_kwargs)
        if not parser.starts:
            return  # this request does not reason: the constraint holds from the first token
        ids = [tokenizer.encode(tag, add_special_tokens=False) for tag in (parser.starts[0], parser.ends[0])]
        if all(len(token_ids) == 1 for token_ids in ids):
            self.constraint = dataclasses.replace(
                self.constraint, reasoning_start_id=ids[0][0], reasoning_end_id=ids[1][0],
                starts_in_reasoning=parser.starts_in_reasoning,
            )


def features_for(config: ServerConfig, tool_use: ToolUse, constraint, constraint_param, kwargs: dict) -> ChatFeatures:
    tool_constraint = tool_use.constraint()
    if tool_constraint is not None:
        if constraint is not None:
            raise InvalidArgumentError(
                f"tool_choice {tool_use.mode!r} is enforced by a grammar and cannot be combined with {constraint_param}",
                param=constraint_param,
            )
        constraint, constraint_param = tool_constraint, "tools"
    return ChatFeatures(
        tool_use=tool_use,
        constraint=constraint,
        constraint_param=constraint_param,
        template_kwargs={**config.default_chat_template_kwargs, **kwargs},
        reasoning_parser=config.reasoning_parser,
        tool_parser=config.tool_call_parser,
    )


def openai_chat_features(config: ServerConfig, body: Any) -> ChatFeatures:
    tools = parse_tools(body.tools)
    auto_enabled = config.enable_auto_tool_choice and config.tool_call_parser is not None
    use = resolve_tool_choice(tools, body.tool_choice, body.parallel_tool_calls, auto_enabled)
    constraint, param = constraint_from_request(body)
    return features_for(config, use, constraint, param, template_kwargs(body.chat_template_kwargs))


def reasoning_effort_kwargs(tokenizer: Any, effort: str | None, param: str) -> dict[str, Any]:
    """vLLM hands ``reasoning_effort`` to the chat template; here only where the template reads
    it (gpt-oss-style templates), so that it never goes silently unused: otherwise a 400."""
    if effort is None:
        return {}
    template = getattr(tokenizer, "chat_template", None)
    texts = list(template.values()) if isinstance(template, dict) else [template or ""]
    if not any("reasoning_effort" in text for text in texts):
        raise InvalidArgumentError(
            f"{param} is not supported by this model: its chat template does not read reasoning_effort "
            "(use chat_template_kwargs where the template has its own switch, e.g. enable_thinking)",
            param=param,
        )
    return {"reasoning_effort": effort}


def check_parser_names(tool_call_parser: str | None, reasoning_parser: str | None) -> None:
    """At startup: the parsers named on the command line exist."""
    if tool_call_parser is not None and tool_call_parser not in TOOL_PARSERS:
        raise InvalidArgumentError(
            f"unknown --tool-call-parser {tool_call_parser!r} ({', '.join(sorted(TOOL_PARSERS))})", param="tool_call_parser"
        )
    if reasoning_parser is not None and reasoning_parser not in REASONING_PARSERS:
        raise InvalidArgumentError(
            f"unknown --reasoning-parser {reasoning_parser!r} ({', '.join(sorted(REASONING_PARSERS))})",
            param="reasoning_parser",
        )
