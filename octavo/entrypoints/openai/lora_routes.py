"""vLLM's runtime adapter routes: ``POST /v1/load_lora_adapter`` and
``POST /v1/unload_lora_adapter`` (only with ``--allow-runtime-lora-updating``:
they let a client make the server read a directory of its choosing).

A loaded adapter is checked by the engine exactly as a ``--lora-modules``
one (a 400 with the reason when it cannot be served) and becomes a model of
its own at once. Each load takes a new adapter id, so an adapter unloaded
and loaded again from another directory never meets the old one's slot or
cached blocks; requests already running keep their adapter to the end.
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request
from pydantic import Field
from starlette.responses import JSONResponse

from octavo.core.lora_request import LoRARequest
from octavo.entrypoints.openai.openapi import add_json_route
from octavo.entrypoints.openai.protocol import OpenAIModel
from octavo.entrypoints.openai.serving import get_context, parse_body
from octavo.errors import InvalidArgumentError, ModelNotFoundError

MAX_PATH_CHARS = 4096
MAX_NAME_CHARS = 256


class LoadLoRAAdapterRequest(OpenAIModel):
    lora_name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    lora_path: str = Field(min_length=1, max_length=MAX_PATH_CHARS)


class UnloadLoRAAdapterRequest(OpenAIModel):
    lora_name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)


class LoRAAdapterResponse(OpenAIModel):
    lora_name: str
    loaded: bool


async def load_lora_adapter(request: Request):
    ctx = get_context(request)
    body = await parse_body(request, LoadLoRAAdapterRequest)
    if body.lora_name in ctx.lora_requests or body.lora_name in ctx.config.served_model_names:
        raise InvalidArgumentError(f"the model name `{body.lora_name}` is already served", param="lora_name")
    adapter_id = ctx.next_lora_id
    ctx.next_lora_id += 1  # taken now: a concurrent load gets another
    lora = LoRARequest(body.lora_name, adapter_id, body.lora_path)
    # Reads the adapter's config and safetensors header: off the event loop.
    await asyncio.to_thread(ctx.engine.engine.check_lora_request, lora)
    if body.lora_name in ctx.lora_requests:  # loaded meanwhile by another request
        raise InvalidArgumentError(f"the model name `{body.lora_name}` is already served", param="lora_name")
    ctx.lora_requests[body.lora_name] = lora
    return JSONResponse({"lora_name": body.lora_name, "loaded": True})


async def unload_lora_adapter(request: Request):
    ctx = get_context(request)
    body = await parse_body(request, UnloadLoRAAdapterRequest)
    if ctx.lora_requests.pop(body.lora_name, None) is None:
        raise ModelNotFoundError(f"no LoRA adapter is served as `{body.lora_name}`", param="lora_name")
    return JSONResponse({"lora_name": body.lora_name, "loaded": False})


def add_routes(app: FastAPI) -> None:
    add_json_route(app, "/v1/load_lora_adapter", load_lora_adapter, body=LoadLoRAAdapterRequest, response=LoRAAdapterResponse)
    add_json_route(
        app, "/v1/unload_lora_adapter", unload_lora_adapter, body=UnloadLoRAAdapterRequest, response=LoRAAdapterResponse
    )
