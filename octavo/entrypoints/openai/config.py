"""What the server (not the engine) is configured with."""

from __future__ import annotations

from dataclasses import dataclass, field

from octavo.core.lora_request import LoRARequest

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# Routes that answer without an API key. Every other route, including any
# added later, requires one (deny by default).
PUBLIC_PATHS = frozenset({"/health", "/version", "/ping"})


@dataclass
class ServerConfig:
    # The names clients may use in "model"; the first is the one reported.
    served_model_names: list[str] = field(default_factory=lambda: ["octavo"])
    # The model as the operator named it (/v1/models "root"); None: the first served name.
    model_root: str | None = None
    api_key: str | None = None
    # Requests (sequences) allowed to wait beyond max_num_seqs before a 503.
    max_queued_requests: int | None = 1024
    # Seconds to let requests finish after SIGTERM before aborting them.
    shutdown_timeout: float = 30.0
    max_request_body_bytes: int = 16 << 20
    max_request_header_bytes: int = 16 << 10
    max_n: int = 128
    max_stop_sequences: int = 16
    max_stop_sequence_chars: int = 1024
    # The web playground and dashboard (octavo.entrypoints.ui); --no-ui turns them off.
    enable_ui: bool = True
    # The path prefix a proxy serves the server under (``--root-path``):
    # requests arrive with it or without it (a proxy that strips it).
    root_path: str = ""
    # Logprob tokens as ``token_id:N`` unless a request says otherwise (--return-tokens-as-token-ids).
    return_tokens_as_token_ids: bool = False
    # Seconds between the periodic stats lines (stats_log.py); 0: none (--disable-log-stats).
    log_stats_interval_s: float = 10.0
    # Longest prompt text tokenised; None: derived from the context and the
    # vocabulary (the longest text that could still fit).
    max_prompt_chars: int | None = None
    # Threads that tokenise and render chat templates (None: min(4, CPUs)).
    tokenizer_pool_size: int | None = None
    # Connections (octavo/entrypoints/openai/connections.py).
    header_read_timeout: float = 10.0  # from connect (or a request's first byte) to the end of its headers
    body_read_timeout: float = 60.0  # from the end of the headers to the end of the body
    # Idle between requests on a kept-alive connection. Longer than clients' own
    # expiry (httpx's is 5 s) so that the client closes first: a server that closes
    # as a client reuses the connection fails that request. Idle connections give
    # way past max_connections anyway.
    keep_alive_timeout: float = 15.0
    max_connections: int = 2048  # open at once; capped by the process's file-descriptor limit
    # How generated text is read back: tool calls (--tool-call-parser, used
    # for tool_choice "auto" once --enable-auto-tool-choice is given) and
    # reasoning (--reasoning-parser).
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    reasoning_parser: str | None = None
    # Chat template variables for every request (a request's chat_template_kwargs win).
    default_chat_template_kwargs: dict = field(default_factory=dict)
    # A usage chunk at the end of every stream, asked for or not.
    enable_force_include_usage: bool = False
    # Log each request's prompt and parameters (off: prompts are the users' data), cut at max_log_len.
    enable_log_requests: bool = False
    max_log_len: int | None = None
    # Responses API answers kept for previous_response_id (responses_api/store.py).
    max_stored_responses: int = 1024
    max_stored_response_bytes: int = 256 << 20
    # LoRA adapters served as models of their own (--lora-modules): name -> PEFT adapter directory.
    lora_modules: dict[str, str] = field(default_factory=dict)
    # POST /v1/load_lora_adapter and /v1/unload_lora_adapter (--allow-runtime-lora-updating).
    allow_runtime_lora_updating: bool = False

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def lora_requests(self) -> dict[str, LoRARequest]:
        """Each adapter's ``LoRARequest``, its id fixed by its place in ``lora_modules``."""
        return {name: LoRARequest(name, index + 1, path) for index, (name, path) in enumerate(self.lora_modules.items())}
