"""TEST-ONLY fault injection for the serving tests; never set these in production.

``OCTAVO_TEST_FAULT_FILE=PATH``: the model step raises once PATH exists (a
test creates the file when it wants the engine to fail, which makes the
moment deterministic). ``OCTAVO_TEST_FAULT_AFTER_STEPS=N``: the model step
raises from step N+1 on. Either makes the executor's ``execute_model`` raise
``InjectedFault``, which is what a crashing model forward looks like to the
engine loop.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

FAULT_FILE_ENV = "OCTAVO_TEST_FAULT_FILE"
FAULT_AFTER_STEPS_ENV = "OCTAVO_TEST_FAULT_AFTER_STEPS"


class InjectedFault(RuntimeError):
    """Raised by the test hook in place of a model forward."""


def install_from_env(engine) -> bool:
    """Wrap the engine's model step if a test asked for a fault; True if it did."""
    fault_file = os.environ.get(FAULT_FILE_ENV) or None
    after_steps_text = os.environ.get(FAULT_AFTER_STEPS_ENV) or None
    if fault_file is None and after_steps_text is None:
        return False
    if not hasattr(engine, "executor"):
        from octavo.errors import InvalidArgumentError

        # A data-parallel engine's models run in its replicas' processes, out of this hook's reach.
        raise InvalidArgumentError(
            f"{FAULT_FILE_ENV} / {FAULT_AFTER_STEPS_ENV} need the engine in the server's process "
            "(--no-engine-process, data_parallel_size=1)"
        )
    after_steps = int(after_steps_text) if after_steps_text is not None else None
    logger.warning(
        "TEST HOOK ACTIVE: the model step will raise (%s=%s, %s=%s)",
        FAULT_FILE_ENV, fault_file, FAULT_AFTER_STEPS_ENV, after_steps,
    )
    execute_model = engine.executor.execute_model
    num_steps = 0

    def faulty_execute_model(scheduler_output):
        nonlocal num_steps
        num_steps += 1
        if after_steps is not None and num_steps > after_steps:
            raise InjectedFault(f"injected fault at step {num_steps}")
        if fault_file is not None and os.path.exists(fault_file):
            raise InjectedFault(f"injected fault at step {num_steps} ({fault_file} exists)")
        return execute_model(scheduler_output)

    engine.executor.execute_model = faulty_execute_model
    return True
