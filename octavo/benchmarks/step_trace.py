"""Where a benchmark's wall time goes, engine step by engine step.

The runner times each ``engine.step()`` on the host: a step's time is from the
previous step's return to this one's, so with decode overlap (the next step
launched before this one's tokens reach the host) it is the host-visible cost
of the step, and the steps' times add up to the loop's wall time. The engine's
``step_observer`` hands over the ``SchedulerOutput`` whose outputs the step
returned, which gives its token and request counts.

A step is "prefill/mixed" when any request computes more than one token
(prompt or chunk, possibly alongside decodes) and "decode" when every request
computes one; "empty" when the step processed no batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from octavo.core.scheduler_output import SchedulerOutput

PREFILL, DECODE, EMPTY = "prefill/mixed", "decode", "empty"
KINDS = (PREFILL, DECODE, EMPTY)


@dataclass
class StepRecord:
    seconds: float
    num_tokens: int
    num_reqs: int
    kind: str


def step_kind(scheduler_output: SchedulerOutput | None) -> str:
    if scheduler_output is None or scheduler_output.is_empty:
        return EMPTY
    return PREFILL if max(scheduler_output.num_scheduled_tokens.values()) > 1 else DECODE


class StepTrace:
    def __init__(self) -> None:
        self.steps: list[StepRecord] = []
        # Host time before the first step (queueing the requests).
        self.setup_seconds = 0.0
        self._current: SchedulerOutput | None = None

    def observe(self, scheduler_output: SchedulerOutput) -> None:
        """The engine's step observer: remember the batch this step processes."""
        self._current = scheduler_output

    def end_step(self, seconds: float) -> None:
        """Close one ``engine.step()`` that took ``seconds`` since the previous return."""
        current, self._current = self._current, None
        tokens = 0 if current is None else current.total_num_scheduled_tokens
        reqs = 0 if current is None else len(current.num_scheduled_tokens)
        self.steps.append(StepRecord(seconds, tokens, reqs, step_kind(current)))

    def summary(self) -> dict[str, dict[str, float]]:
        """Per kind (and "all"): steps, total seconds, mean ms, mean tokens and requests per step."""
        groups = {kind: [s for s in self.steps if s.kind == kind] for kind in KINDS}
        groups = {kind: steps for kind, steps in groups.items() if steps or kind != EMPTY}
        groups["all"] = self.steps
        table = {}
        for kind, steps in groups.items():
            n = len(steps)
            total = sum(s.seconds for s in steps)
            table[kind] = {
                "steps": n,
                "seconds": total,
                "mean_ms": 1e3 * total / n if n else 0.0,
                "mean_tokens": sum(s.num_tokens for s in steps) / n if n else 0.0,
                "mean_reqs": sum(s.num_reqs for s in steps) / n if n else 0.0,
            }
        return table

    def format_table(self) -> str:
        header = f"{'step kind':14s} {'steps':>6} {'seconds':>9} {'share':>6} {'mean ms':>9} {'tokens/step':>11} {'reqs/step':>9}"
        lines = [header, "-" * len(header)]
        summary = self.summary()
        wall = summary["all"]["seconds"] + self.setup_seconds
        for kind, row in summary.items():
            share = row["seconds"] / wall if wall else 0.0
            lines.append(
                f"{kind:14s} {row['steps']:6d} {row['seconds']:9.3f} {100 * share:5.1f}% {row['mean_ms']:9.2f} "
                f"{row['mean_tokens']:11.1f} {row['mean_reqs']:9.1f}"
            )
        lines.append(f"(before the first step: {self.setup_seconds:.3f} s adding requests)")
        return "\n".join(lines)

    def to_json(self) -> dict:
        """The summary and every step, column-wise (seconds rounded to microseconds)."""
        return {
            "summary": self.summary(),
            "setup_seconds": self.setup_seconds,
            "steps": {
                "seconds": [round(s.seconds, 6) for s in self.steps],
                "num_tokens": [s.num_tokens for s in self.steps],
                "num_reqs": [s.num_reqs for s in self.steps],
                "kind": [s.kind for s in self.steps],
            },
        }
