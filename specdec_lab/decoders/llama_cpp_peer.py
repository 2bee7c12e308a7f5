"""Peer: llama.cpp (through llama-cpp-python), running a model's GGUF file as it is, measured into
the same `GenerationResult` as our decoders.

It is the engine a CPU user would pick instead of PyTorch, so it is the speed to beat. Optional:
install it with `make llama-cpp` (it builds from source, a few minutes on 2 cores; pip caches the
wheel). Token ids go in and come out directly: the GGUF's vocabulary is the one the kit's
tokenizer (converted from the same file) uses, so no text round trip can change the prompt.

Greedy only (temperature 0: llama.cpp's greedy sampler takes the argmax). Its prompt-lookup
decoding (`LlamaPromptLookupDecoding`) is the binding's one speculative option; the binding offers
no draft-model speculation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec_lab.decoders.common import DecodingRun
from specdec_lab.models import zoo
from specdec_lab.models.llama_cpp import PACKAGE, available, check_available, gguf_kind  # noqa: F401  (the peer's API)
from specdec_lab.result import GenerationResult

@dataclass
class LlamaCppPeer:
    """A loaded llama.cpp model and what the decode loop needs to know about it."""

    llm: object  # llama_cpp.Llama
    path: Path
    threads: int
    prompt_lookup_tokens: int  # 0: plain AR; else tokens proposed per prompt-lookup step
    device: torch.device = torch.device("cpu")

    @property
    def weight_bytes(self) -> int:
        return self.path.stat().st_size  # the GGUF is memory-mapped and used as it is


def load(gguf_path: str | Path, threads: int | None = None, context_tokens: int = 4096,
         prompt_lookup_tokens: int = 0) -> LlamaCppPeer:
    """Load a .gguf file with llama.cpp on `threads` CPU threads (default: torch's thread count, so
    both stacks use the same cores)."""
    check_available()
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    path = Path(gguf_path)
    if path.suffix != ".gguf" or not path.is_file():
        raise FileNotFoundError(f"llama.cpp needs a .gguf file, got {str(gguf_path)!r}: pass a zoo model's GGUF "
                                "(zoo.assemble_gguf(name)) or a path to one")
    threads = threads or torch.get_num_threads()
    draft = LlamaPromptLookupDecoding(num_pred_tokens=prompt_lookup_tokens) if prompt_lookup_tokens else None
    llm = Llama(model_path=str(path), n_ctx=context_tokens, n_threads=threads, n_threads_batch=threads,
                draft_model=draft, logits_all=draft is not None, verbose=False)
    return LlamaCppPeer(llm, path, threads, prompt_lookup_tokens)


def generate(model: LlamaCppPeer, prompt_ids, max_new_tokens: int, stop_ids: Iterable[int]) -> GenerationResult:
    """Greedy decoding until a stop token or `max_new_tokens`; the cache is reset first, so every
    call prefills its whole prompt like ours."""
    run = DecodingRun(model, prompt_ids, max_new_tokens, frozenset(stop_ids))
    tokens: list[int] = []
    with run:
        model.llm.reset()  # n_tokens = 0: generate() then re-evaluates the whole prompt instead of reusing a cached prefix
        stream = model.llm.generate(run.prompt_ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, typical_p=1.0,
                                    repeat_penalty=1.0, reset=True)
        for token in stream:
            if not tokens:
                run.first_token_done()
            tokens.append(int(token))
            if len(tokens) >= max_new_tokens or token in run.stop_ids:
                break
        stream.close()
    steps = len(tokens) - 1
    return run.result(tokens, accepted_per_step=[0] * steps, proposed_per_step=[0] * steps,
                      target_forwards=0 if model.prompt_lookup_tokens else len(tokens),
                      extras={"engine": "llama.cpp", "threads": model.threads,
                              "prompt_lookup_tokens": model.prompt_lookup_tokens,
                              "forwards_counted": not model.prompt_lookup_tokens})


def load_for(spec: str, prompt_lookup_tokens: int = 0) -> LlamaCppPeer:
    """llama.cpp on the GGUF file a zoo model (or a .gguf spec) comes from, on torch's thread count;
    with prompt_lookup_tokens > 0, decoding with the binding's prompt lookup."""
    if spec in zoo.ZOO:
        return load(zoo.assemble_gguf(spec), prompt_lookup_tokens=prompt_lookup_tokens)
    if str(spec).endswith(".gguf"):
        return load(spec, prompt_lookup_tokens=prompt_lookup_tokens)
    raise ValueError(f"llama_cpp: true needs a GGUF file to run, but target {spec!r} is neither a zoo name nor a "
                     ".gguf path: set llama_cpp: false, or give the target as a .gguf file")
