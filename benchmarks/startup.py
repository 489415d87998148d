"""How long Octavo takes to start, phase by phase (never a timed test).

  python benchmarks/startup.py serve MODEL [serve flags...]
      time from launching ``octavo serve`` to a healthy ``/health`` and to
      the first token of one request, with the phases the server logged
      (``start-up: <phase> <s>s`` lines, from both the server and its
      engine process)
  python benchmarks/startup.py engine --model DIR [--dtype ...] [--max-num-seqs N] ...
      in one fresh process: build the engine (``LLM``'s path), then one
      token; time since the process started, peak RSS, and the phases

``--baseline`` adds, measured the same way in fresh processes: the floor
(Python, ``import torch`` and the device's first allocation, which any
engine pays) and Hugging Face transformers (``from_config`` at the same
shapes on the same device, then one generated token).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PHASE = re.compile(r"start-up: (?P<name>.+?) (?P<seconds>\d+\.\d+)s")
LISTENING = re.compile(r"Uvicorn running on (https?)://127\.0\.0\.1:(\d+)")
CLI = [sys.executable, "-m", "octavo.entrypoints.cli.main"]

ENGINE_CHILD = """
import json, logging, resource, sys
logging.basicConfig(level=logging.INFO, format="%(message)s")
from octavo.core.sampling_params import SamplingParams
from octavo.engine_args import EngineArgs, build_engine
from octavo.runtime.startup import seconds_since_process_start
engine = build_engine(EngineArgs(**json.loads(sys.argv[1])))
ready = seconds_since_process_start()
engine.add_request("r", "Once upon a time", SamplingParams(temperature=0, max_tokens=1))
while engine.has_unfinished_requests():
    engine.step()
first = seconds_since_process_start()
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"ready_s": ready, "first_token_s": first, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mib": usage.ru_maxrss / 1024}))
engine.shutdown()
"""

FLOOR_CHILD = """
import json, sys, torch
from octavo.runtime.startup import seconds_since_process_start
device = sys.argv[1]
torch.zeros(1, device=device)
print(json.dumps({"first_token_s": seconds_since_process_start()}))
"""

HF_CHILD = """
import json, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
from octavo.runtime.startup import seconds_since_process_start
model_dir, device, dtype, dummy = sys.argv[1], sys.argv[2], getattr(torch, sys.argv[3]), sys.argv[4] == "dummy"
if dummy:  # random weights at the checkpoint's shapes, as --load-format dummy
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=dtype)
else:
    # No device_map on the CPU: transformers 5.25 asks torch.cuda for free memory
    # whenever one is given, which a CPU-only torch refuses.
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, device_map=None if device == "cpu" else device)
ready = seconds_since_process_start()
model.generate(torch.tensor([[1, 2, 3, 4]], device=device), max_new_tokens=1, do_sample=False)
print(json.dumps({"ready_s": ready, "first_token_s": seconds_since_process_start()}))
"""


def phases(log: str) -> list[tuple[str, float]]:
    """The ``start-up:`` phases a log holds, in order."""
    return [(m["name"], float(m["seconds"])) for m in PHASE.finditer(log)]


def _child_env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))


def _run_child(code: str, *argv: str) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=_child_env(), timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"child failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def measure_serve(serve_args: list[str], log_path: Path) -> dict:
    started = time.monotonic()
    with open(log_path, "wb") as log:
        process = subprocess.Popen([*CLI, "serve", *serve_args, "--port", "0"], stdout=log, stderr=subprocess.STDOUT, env=_child_env())
    try:
        url = _wait_for_url(process, log_path)
        _wait_healthy(process, url, log_path)
        healthy = time.monotonic() - started
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 1, "temperature": 0}).encode()
        request = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=600).read()
        first = time.monotonic() - started
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
    return {"healthy_s": healthy, "first_token_s": first, "phases": phases(log_path.read_text(errors="replace"))}


def _wait_for_url(process, log_path: Path) -> str:
    while True:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
        match = LISTENING.search(log_path.read_text(errors="replace"))
        if match:
            return f"{match[1]}://127.0.0.1:{match[2]}"
        time.sleep(0.05)


def _wait_healthy(process, url: str, log_path: Path) -> None:
    while True:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            if urllib.request.urlopen(f"{url}/health", timeout=5).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)


def measure_engine(engine_args: dict) -> dict:
    result, stderr = _run_child(ENGINE_CHILD, json.dumps(engine_args))
    return {**result, "phases": phases(stderr)}


def baselines(model_dir: str, device: str, dtype: str, load_format: str) -> dict[str, dict]:
    """The floor and HF's start; one that fails is reported, and the others still print."""
    how = "from_config" if load_format == "dummy" else "from_pretrained"
    children = {
        "floor (python + torch + device)": (FLOOR_CHILD, device),
        f"HF transformers {how}": (HF_CHILD, model_dir, device, dtype, load_format),
    }
    results = {}
    for name, (code, *argv) in children.items():
        try:
            results[name], _ = _run_child(code, *argv)
        except (SystemExit, subprocess.TimeoutExpired, ValueError) as exc:
            print(f"{name}: failed: {str(exc)[-2000:]}", file=sys.stderr)
    return results


def print_table(title: str, result: dict, others: dict[str, dict]) -> None:
    print(f"{title}")
    print(f"  {'phase (as logged)':46s} {'seconds':>8s}")
    for name, seconds in result["phases"]:
        print(f"  {name:46s} {seconds:8.2f}")
    for key in ("healthy_s", "ready_s", "first_token_s"):
        if key in result:
            print(f"  {'octavo: ' + key.removesuffix('_s').replace('_', ' ') + ' after start':46s} {result[key]:8.2f}")
    if "cpu_s" in result:
        print(f"  {'octavo: CPU seconds (user + system)':46s} {result['cpu_s']:8.2f}")
    if "peak_rss_mib" in result:
        print(f"  {'octavo: peak RSS (MiB)':46s} {result['peak_rss_mib']:8.0f}")
    for name, other in others.items():
        print(f"  {name + ': first token after start':46s} {other['first_token_s']:8.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("serve", "engine"))
    parser.add_argument("--baseline", action="store_true", help="also time the floor and HF transformers")
    parser.add_argument("--device", default="cuda", help="the device of the baselines (default cuda)")
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--log", default="/tmp/octavo-startup-serve.log", help="serve mode: where the server's log goes")
    args, rest = parser.parse_known_args(argv)
    if args.mode == "serve":
        result = measure_serve(rest, Path(args.log))
        model = next((a for a in rest if not a.startswith("-")), None)
    else:
        engine_parser = argparse.ArgumentParser()
        for flag in ("--model", "--dtype", "--load-format"):
            engine_parser.add_argument(flag, default=None)
        for flag in ("--max-num-seqs", "--max-model-len"):
            engine_parser.add_argument(flag, type=int, default=None)
        engine_args = {k: v for k, v in vars(engine_parser.parse_args(rest)).items() if v is not None}
        result = measure_engine(engine_args)
        model = engine_args.get("model")
    flag = {a: rest[i + 1] for i, a in enumerate(rest[:-1]) if a.startswith("--")}
    load_format = flag.get("--load-format", "auto")
    others = baselines(model, args.device, flag.get("--dtype", "bfloat16"), load_format) if args.baseline and model else {}
    print_table(f"octavo {args.mode} start-up ({' '.join(rest)})", result, others)
    if args.output_json:
        Path(args.output_json).write_text(json.dumps({"octavo": result, **others}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
