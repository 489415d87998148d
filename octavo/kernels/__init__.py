"""Triton kernels for the GPU fast path, each next to a plain-torch reference.

One concept per module:

- ``paged_attention``: attention of a mixed batch (decode rows, prefill
  rows, chunked prefill, prefix-cache hits) over the paged KV cache.
- ``split_kv_decode``: decode attention with the context split across
  programs, then merged by a reduce kernel (long contexts, small batches).
- ``kv_cache_write``: store a step's keys and values at their cache slots.
- ``rms_norm``, ``rotary``, ``activation``, ``gemv``, ``quant/``: layer-op
  implementations (``octavo.ops``), registered for the GPU by ``builtin``
  through the built-in plugin's ``octavo_layer_ops`` hook; the layers call
  whatever the model's resolved ops table holds. Nothing here imports
  ``octavo.models``.
- ``reference``: the plain-torch references the tests compare against.

Importing this package imports nothing heavy; each kernel module imports
triton, so import those only where triton is installed. On a machine without
a GPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``,
set before triton is imported).
"""
