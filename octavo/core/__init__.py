"""Hardware-agnostic core: requests, scheduler, KV-cache blocks, engine loop."""
