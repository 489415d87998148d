"""Which LoRA adapter a request runs with (vLLM's ``LoRARequest``).

Plain values, so that it crosses processes as msgpack. ``lora_int_id``
names the adapter inside the engine (its slot, its prefix-cache key): two
requests with the same id share an adapter, so one id must always mean the
same ``lora_path``.
"""

from __future__ import annotations

from dataclasses import dataclass

from octavo.errors import InvalidArgumentError


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise InvalidArgumentError("LoRARequest.lora_name must be a non-empty string", param="lora_request")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise InvalidArgumentError(
                f"LoRARequest.lora_int_id must be an integer >= 1, got {self.lora_int_id!r}", param="lora_request"
            )
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise InvalidArgumentError("LoRARequest.lora_path must be a non-empty string", param="lora_request")



def request_cache_key(cache_salt: str | None, lora_request: LoRARequest | None) -> bytes:
    """A request's extra prefix-cache key: its salt, and its adapter (KV
    computed under one adapter is not another's). The salt is length-prefixed
    when an adapter follows, so that no salt can spell another salt plus an adapter."""
    salt = cache_salt.encode() if cache_salt else b""
    if lora_request is None:
        return salt
    return len(salt).to_bytes(4, "little") + salt + b"lora:" + str(lora_request.lora_int_id).encode()
