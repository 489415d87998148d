"""Field types of the request bodies (OpenAI and Anthropic routes).

They check representability when the body is parsed, in the API process:
integers fit a signed 64-bit integer (values travel as msgpack to engine
processes and become tensors), floats are finite (JSON's ``1e999`` parses as
infinity), token ids are non-negative. Ranges that depend on the meaning
(``temperature >= 0``, ``top_p`` in (0, 1]) are checked by
``SamplingParams`` and the serving layer, the one place both the HTTP
routes and the Python API go through, with the field named in the error.

``Prompt`` picks its union member from the input's shape in one look
instead of trying each member in turn: a plain union validated a
5-million-id prompt four times over (seconds of a blocked event loop).
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Discriminator, Field, Tag

from octavo.core.sampling_params import INT64_MAX, INT64_MIN
from octavo.errors import InvalidArgumentError

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
TokenId = Annotated[int, Field(ge=0, le=INT64_MAX)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


def _prompt_shape(value: Any) -> str | None:
    if isinstance(value, str):
        return "text"
    if not isinstance(value, list):
        return None
    first = value[0] if value else 0
    if isinstance(first, str):
        return "texts"
    if isinstance(first, list):
        return "token_id_lists"
    return "token_ids"


Prompt = Annotated[
    Union[
        Annotated[str, Tag("text")],
        Annotated[list[str], Tag("texts")],
        Annotated[list[TokenId], Tag("token_ids")],
        Annotated[list[list[TokenId]], Tag("token_id_lists")],
    ],
    Discriminator(
        _prompt_shape,
        custom_error_type="invalid_prompt",
        custom_error_message="a prompt is a string, a list of strings, a list of token ids or a list of lists of token ids",
    ),
]


def token_biases(logit_bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's ``logit_bias`` (token ids as JSON object keys, so strings) with
    integer keys; a key that is not a decimal token id is a 400 naming it."""
    if not logit_bias:
        return None
    biases = {}
    for key, bias in logit_bias.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 19):
            shown = key if len(key) <= 20 else f"{key[:20]}..."
            raise InvalidArgumentError(f"logit_bias keys must be token ids, got {shown!r}", param="logit_bias")
        biases[int(key)] = bias
    return biases
