"""The Ray executor: one worker actor per device, across the nodes of a cluster.

A placement group reserves one bundle per rank (one device each; ``PACK``
keeps a stage's ranks together when a node has room), and each rank's actor
is pinned to its bundle. Rank 0's node address and a free port on it are the
rendezvous of ``torch.distributed`` (the platform's backend), as with the
multiprocess executor; Ray only starts, places and messages the workers.

Invariants:
- Actor methods take and return msgpack bytes only (the worker protocol of
  ``worker_host``); no dataclass is pickled by Ray.
- Calls to one actor run in submission order (one execution thread per
  actor), so up to ``pipeline_parallel_size`` batches can be in flight; a
  health ping runs in its own concurrency group so it never waits behind a
  step.
- Any failure (an error reply, a dead actor, a step past
  ``OCTAVO_EXECUTE_TIMEOUT_S``) kills every actor, frees the placement group
  and makes the executor dead: pending and later calls raise
  ``EngineDeadError``.
- Octavo connects to a running cluster (``RAY_ADDRESS``) or starts a local
  one when none is initialised; it never shuts down a Ray session it did not
  start.
"""

from __future__ import annotations

import logging
import os

from octavo.core.scheduler_output import SchedulerOutput
from octavo.distributed.parallel_state import output_rank
from octavo.errors import EngineDeadError, InvalidArgumentError, OctavoError
from octavo.runtime.config import WorkerConfig
from octavo.runtime.executors.multiproc import EXECUTE_TIMEOUT_S, START_TIMEOUT_S
from octavo.runtime.executors.worker_host import encode_call, encode_setup, unpack_reply
from octavo.runtime.worker import RankInfo

logger = logging.getLogger(__name__)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise InvalidArgumentError(
            "distributed_executor_backend='ray' needs Ray: pip install 'octavo[ray]'",
            param="distributed_executor_backend",
        ) from None
    return ray


class RayWorkerActor:
    """Runs in a Ray worker process; becomes a ``WorkerHost`` at ``setup``."""

    def __init__(self) -> None:
        self.host = None

    def node(self) -> tuple[str, str]:
        import ray

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def free_port(self) -> int:
        from octavo.runtime.executors.multiproc import free_loopback_port

        return free_loopback_port()

    def setup(self, setup: bytes, num_local_workers: int) -> bytes:
        from octavo.distributed.serialization import encode
        from octavo.runtime.executors.worker_host import WorkerHost, encode_error, limit_cpu_threads

        limit_cpu_threads(num_local_workers)
        try:
            self.host = WorkerHost(setup)
        except BaseException as exc:  # noqa: BLE001 - reported to the engine
            return encode_error(exc)
        return encode(["ok", None])

    def call(self, message: bytes) -> bytes | None:
        return self.host.handle(message)


def _actor_class(ray):
    """``RayWorkerActor`` as a Ray actor whose ping skips the step queue."""

    class HealthCheckedWorkerActor(RayWorkerActor):
        @ray.method(concurrency_group="health")
        def ping(self) -> bool:
            return True

    return ray.remote(concurrency_groups={"health": 1})(HealthCheckedWorkerActor)


class RayPendingOutput:
    def __init__(self, executor: "RayExecutor", refs: list) -> None:
        self._executor = executor
        self._refs = refs

    def result(self):
        return self._executor._collect(self._refs)


class RayExecutor:
    def __init__(self, config: WorkerConfig) -> None:
        self.ray = ray = _import_ray()
        self.config = config
        tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
        self.world_size = tp * pp
        self.max_concurrent_batches = pp
        self._output_rank = output_rank(tp, pp)
        self._dead: EngineDeadError | None = None
        self._closed = False
        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False)
        self._placement_group, self._actors = None, []
        try:
            self._start(config)
            self._call_all("load_model")
        except BaseException:
            self.shutdown()
            raise

    def _start(self, config: WorkerConfig) -> None:
        ray = self.ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from octavo.plugins.selection import select_platform

        platform = select_platform(config.platform).platform
        # Platforms may name their Ray resource; accelerators default to GPU.
        key = getattr(platform, "ray_device_key", None) or ("CPU" if platform.device_type == "cpu" else "GPU")
        self._placement_group = placement_group([{key: 1.0}] * self.world_size, strategy="PACK")
        ready, _ = ray.wait([self._placement_group.ready()], timeout=START_TIMEOUT_S)
        if not ready:
            raise InvalidArgumentError(
                f"the Ray cluster cannot place {self.world_size} workers of one {key} each "
                f"(available: {ray.available_resources()})",
                param="distributed_executor_backend",
            )
        remote = _actor_class(ray)
        resources = {"num_cpus": 1} if key == "CPU" else {"num_cpus": 0, "resources": {key: 1}}
        if key == "GPU":
            resources = {"num_cpus": 0, "num_gpus": 1}
        self._actors = [
            remote.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._placement_group, placement_group_bundle_index=i),
                **resources,
            ).remote()
            for i in range(self.world_size)
        ]
        nodes = ray.get([a.node.remote() for a in self._actors], timeout=START_TIMEOUT_S)
        port = ray.get(self._actors[0].free_port.remote(), timeout=START_TIMEOUT_S)
        init_method = f"tcp://{nodes[0][1]}:{port}"
        setups = []
        for rank, (node_id, _) in enumerate(nodes):
            same_node = [r for r, (n, _) in enumerate(nodes) if n == node_id]
            # Ray hides other actors' GPUs: each actor's device is its index 0.
            local_rank = same_node.index(rank) if key == "CPU" else 0
            info = RankInfo(rank, self.world_size, init_method, local_rank=local_rank)
            setups.append(self._actors[rank].setup.remote(encode_setup(config, info), len(same_node)))
        for rank, data in enumerate(ray.get(setups, timeout=START_TIMEOUT_S)):
            unpack_reply(data, rank)

    # ------------------------------------------------------------- protocol

    def determine_num_kv_blocks(self) -> int:
        return min(self._call_all("determine_num_kv_blocks"))

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self._call_all("initialize_kv_cache", num_blocks)

    def attention_backend_names(self) -> list[str]:
        return sorted(set().union(*self._call_all("attention_backend_names")))

    def lora_targets(self) -> dict[str, tuple[int, int]]:
        return {name: tuple(sizes) for name, sizes in self._call_all("lora_targets")[0].items()}

    def reload_weights(self, weights_path: str | None) -> list[int]:
        return self._call_all("reload_weights", weights_path)

    def execute_model(self, scheduler_output: SchedulerOutput, non_block: bool = False):
        self._raise_if_dead()
        message = encode_call("execute_model", scheduler_output)
        pending = RayPendingOutput(self, [a.call.remote(message) for a in self._actors])
        return pending if non_block else pending.result()

    def check_health(self) -> None:
        self._raise_if_dead()
        refs = [a.ping.remote() for a in self._actors]
        try:
            self.ray.get(refs, timeout=30)
        except Exception as exc:  # noqa: BLE001 - RayActorError, GetTimeoutError
            raise self._fail(EngineDeadError(f"a Ray worker is not answering: {type(exc).__name__}: {exc}")) from None

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._actors and self._dead is None:
            try:
                self.ray.get([a.call.remote(encode_call("shutdown")) for a in self._actors], timeout=10)
            except Exception:  # noqa: BLE001 - killed below anyway
                pass
        self._release()
        if self._dead is None:
            self._dead = EngineDeadError("the executor was shut down")

    # -------------------------------------------------------------- helpers

    def _call_all(self, method: str, *args) -> list:
        self._raise_if_dead()
        message = encode_call(method, *args)
        refs = [a.call.remote(message) for a in self._actors]
        try:
            replies = self.ray.get(refs, timeout=START_TIMEOUT_S)
            return [unpack_reply(data, rank) for rank, data in enumerate(replies)]
        except OctavoError as exc:
            raise self._fail(exc, typed=True) from None
        except Exception as exc:  # noqa: BLE001
            raise self._fail(EngineDeadError(f"Ray worker failed in {method}: {type(exc).__name__}: {exc}")) from None

    def _collect(self, refs: list):
        """Wait for one step on every rank; any error on any rank is fatal."""
        self._raise_if_dead()
        output_ref = refs[self._output_rank]
        remaining, output = list(refs), None
        while remaining:
            ready, remaining = self.ray.wait(remaining, num_returns=1, timeout=EXECUTE_TIMEOUT_S)
            if not ready:
                raise self._fail(EngineDeadError(f"a step did not finish within {EXECUTE_TIMEOUT_S:.0f} s"))
            rank = refs.index(ready[0])
            try:
                data = self.ray.get(ready[0])
                value = unpack_reply(data, rank) if data is not None else None
            except OctavoError as exc:
                raise self._fail(exc) from None
            except Exception as exc:  # noqa: BLE001 - RayActorError: the actor's process died
                raise self._fail(EngineDeadError(f"Ray worker rank {rank} died: {type(exc).__name__}: {exc}")) from None
            if ready[0] == output_ref:
                output = value
        return output

    def _fail(self, error: BaseException, typed: bool = False) -> BaseException:
        dead = error if isinstance(error, EngineDeadError) else EngineDeadError(str(error))
        if self._dead is None:
            logger.error("Ray executor failed: %s", dead)
            self._dead = dead
            self._release()
        return error if typed and isinstance(error, OctavoError) else self._dead

    def _release(self) -> None:
        for actor in self._actors:
            try:
                self.ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._actors = []
        if self._placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self._placement_group)
            except Exception:  # noqa: BLE001
                pass
            self._placement_group = None

    def _raise_if_dead(self) -> None:
        if self._dead is not None:
            raise self._dead
