"""Executors that run workers outside the engine's process (see ``octavo.runtime.executor``)."""
