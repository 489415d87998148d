"""gpt-oss (vLLM's ``openai_gptoss``): the harmony format's ``analysis``
channel is the reasoning, the ``final`` channel (and a ``commentary``
preamble without a recipient) the answer; see ``tool_parsers/harmony_format.py``.

Messages addressed to a tool are not text for the user: alone, this parser
drops them; in front of the ``openai`` tool parser it hands every message
but the reasoning on as written (markers included), for that parser to read
the calls and the answer from.
"""

from __future__ import annotations

from octavo.entrypoints.openai.tool_parsers.harmony_format import CHANNEL, END, MESSAGE, HarmonyReader
from octavo.entrypoints.openai.reasoning.base import ReasoningParser


class HarmonyReasoningParser(ReasoningParser):
    needs_special_tokens = True
    # Where the reasoning starts and ends; several tokens each, so an output
    # constraint holds from the first token (chat_features.constrain_after_reasoning).
    starts = (f"{CHANNEL}analysis{MESSAGE}",)
    ends = (END,)

    def __init__(self) -> None:
        super().__init__()
        self.reader = HarmonyReader()
        self.forward_messages = False  # set where a harmony tool parser reads what follows

    def _advance(self, final: bool) -> tuple[str, str]:
        events = self.reader.read(self.text, final)
        reasoning: list[str] = []
        content: list[str] = []
        for event in events:
            if event.header.is_reasoning:
                reasoning.append(event.text)
            elif self.forward_messages:
                content.append(event.raw)
            elif event.header.is_visible:
                content.append(event.text)
        return "".join(reasoning), "".join(content)
