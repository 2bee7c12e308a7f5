"""llama.cpp as an engine under the kit's decoders: a GGUF file run by llama.cpp's own kernels
(through llama-cpp-python's C API), with one KV-cache sequence that the decoders drive.

What a decoder needs from an engine (see `decoders.backend`) maps onto llama.cpp directly:
- a forward over n tokens at given positions is one `llama_decode` on a batch, with an output flag
  on each row whose logits are wanted;
- a crop of the cache is `llama_memory_seq_rm(memory, 0, length, -1)`;
- a custom attention mask is expressed with sequence ids, as llama.cpp's own lookahead and tree
  examples do. In a unified KV cache a query sees a cell when the cell carries the query's (first)
  sequence id and sits at a position <= the query's. So every query off the causal path gets a
  sequence id of its own, the cached prefix is copied into it, and each new token's cell carries the
  ids of the queries that may see it.

Optional: `make llama-cpp` installs llama-cpp-python (built from source for this CPU).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

PACKAGE = "llama-cpp-python==0.3.36"  # the pinned engine; `make llama-cpp` installs it
MAX_SEQUENCES = 256  # sequence ids per context (llama.cpp's LLAMA_MAX_SEQ): 0 is the decoded sequence, the rest serve masked forwards


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def check_available() -> None:
    if not available():
        raise ImportError(f"the llama.cpp backend needs {PACKAGE}: run `make llama-cpp` (builds it from source, a "
                          "few minutes on 2 cores), or run the model on transformers (models.load)")


@dataclass(eq=False)
class LlamaCppModel:
    """A GGUF file loaded by llama.cpp: the model, one context (one KV cache) and a reusable batch."""

    path: Path
    threads: int
    context_tokens: int
    handle: object  # llama_model_p
    context: object  # llama_context_p
    vocab_size: int
    eos_token_ids: frozenset[int]
    device: torch.device = torch.device("cpu")
    sequence_generation: int = field(default=0, init=False)  # which open sequence owns the cache
    _batch: object = field(default=None, init=False, repr=False)
    _batch_capacity: int = field(default=0, init=False, repr=False)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def weight_bytes(self) -> int:
        return self.path.stat().st_size  # the GGUF is memory-mapped and used as it is

    def batch(self, tokens: int):
        """A llama_batch with room for `tokens` tokens of up to MAX_SEQUENCES sequence ids each."""
        import llama_cpp

        if tokens > self._batch_capacity:
            if self._batch is not None:
                llama_cpp.llama_batch_free(self._batch)
            self._batch_capacity = max(tokens, 2 * self._batch_capacity, 64)
            self._batch = llama_cpp.llama_batch_init(self._batch_capacity, 0, MAX_SEQUENCES)
        return self._batch

    def __del__(self):
        try:
            import llama_cpp

            if self._batch is not None:
                llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self.context)
            llama_cpp.llama_model_free(self.handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown: the library may be gone already
            pass


def load(gguf_path: str | Path, threads: int | None = None, context_tokens: int = 4096) -> LlamaCppModel:
    """Load a .gguf file into llama.cpp on `threads` CPU threads (default: torch's thread count, so
    both engines use the same cores), with a `context_tokens` KV cache."""
    check_available()
    import llama_cpp
    from llama_cpp._logger import set_verbose

    path = Path(gguf_path)
    if path.suffix != ".gguf" or not path.is_file():
        raise FileNotFoundError(f"llama.cpp needs a .gguf file, got {str(gguf_path)!r}: pass a zoo model's GGUF "
                                "(zoo.assemble_gguf(name)) or a path to one")
    set_verbose(False)  # llama.cpp logs every tensor at load; errors still print
    threads = int(threads or torch.get_num_threads())
    llama_cpp.llama_backend_init()
    model_params = llama_cpp.llama_model_default_params()
    model_params.n_gpu_layers = 0
    handle = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params)
    if not handle:
        raise RuntimeError(f"llama.cpp could not load {path} (see its error above)")
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = params.n_batch = context_tokens  # a prefill is one batch, however long the prompt
    params.n_ubatch = 512
    params.n_seq_max = MAX_SEQUENCES
    params.kv_unified = True  # one cache whose cells several sequences share: masks need it
    params.swa_full = True  # sliding-window layers keep every cell, so a crop can always roll back
    params.n_threads = params.n_threads_batch = threads
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED  # as the llama.cpp peer runs (Llama default)
    context = llama_cpp.llama_init_from_model(handle, params)
    if not context:
        llama_cpp.llama_model_free(handle)
        raise RuntimeError(f"llama.cpp could not create a context for {path} with {context_tokens} tokens")
    vocab = llama_cpp.llama_model_get_vocab(handle)
    stops = {int(llama_cpp.llama_vocab_eos(vocab)), int(llama_cpp.llama_vocab_eot(vocab))} - {-1}
    return LlamaCppModel(path, threads, context_tokens, handle, context,
                         int(llama_cpp.llama_vocab_n_tokens(vocab)), frozenset(stops))


def gguf_kind(file_name: str, unknown: str = "GGUF") -> str:
    """'qwen2.5-coder-1.5b-instruct-q4_k_m.gguf' -> 'Q4_K_M', 'SmolLM2-135M-Instruct.Q4_1.gguf' -> 'Q4_1'."""
    found = re.search(r"q\d+(_[a-z0-9]+)*(?=\.gguf$)", file_name, re.IGNORECASE)
    return found.group(0).upper() if found else unknown


def gguf_bytes_read_per_token(path: Path) -> int:
    """Bytes of a GGUF's tensors that one decode step reads: all of them but the token-embedding
    table, unless the file has no separate output matrix (then the tied table is the output head)."""
    import gguf

    sizes = {tensor.name: int(tensor.n_bytes) for tensor in gguf.GGUFReader(str(path)).tensors}
    embedding = sizes.get("token_embd.weight", 0)
    return sum(sizes.values()) - (embedding if "output.weight" in sizes else 0)


def kept_rows(n: int, keep: int | Sequence[int]) -> list[int]:
    """The rows whose logits are wanted, in order: keep=k means the last k rows (0: all), a list
    names them (negative indices count from the end, as in torch)."""
    if isinstance(keep, int):
        return list(range(n - keep if 0 < keep <= n else 0, n))
    rows = [int(row) for row in keep]
    if any(not -n <= row < n for row in rows):
        raise ValueError(f"rows {rows} asked of a forward over {n} tokens")
    return [row % n for row in rows]


class LlamaCppSequence:
    """One sequence in a llama.cpp context: `forward`, `crop`, `length` (see decoders.backend).

    A model has one KV cache, so opening a sequence clears it, and a sequence that was replaced by a
    newer one on the same model refuses to run instead of reading the other one's cache.
    """

    def __init__(self, model: LlamaCppModel):
        import llama_cpp

        self.model = model
        self.memory = llama_cpp.llama_get_memory(model.context)
        llama_cpp.llama_memory_clear(self.memory, True)
        model.sequence_generation += 1
        self.generation = model.sequence_generation
        self.length = 0
        self._causal_length: int | None = None  # after a masked forward: how much of it may stay
        self._mask_sequences: list[int] = []
        self._last_forward: tuple[int, list[list[bool]] | None] | None = None  # (start, its mask over new tokens)

    def _check_owner(self) -> None:
        if self.model.sequence_generation != self.generation:
            raise RuntimeError(f"this llama.cpp sequence on {self.model.name} was replaced by a newer one: a loaded "
                               "GGUF has one KV cache, so load the file twice to decode two sequences at once")
        if self._causal_length is not None:
            raise RuntimeError("a masked forward's tokens are still in the cache: crop() back to the causal part "
                               "first (a decoder keeps only tokens that saw a correct context)")

    def forward(self, token_ids: Sequence[int], keep: int | Sequence[int] = 0,
                positions: Sequence[int] | None = None, visible: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (rows of `keep`, vocab) of `token_ids` appended after the cache; with `positions`
        and a boolean (n, length + n) `visible` mask, each query sees only what the mask allows."""
        self._check_owner()
        n, start = len(token_ids), self.length
        if n == 0:
            raise ValueError("a forward needs at least one token")
        if start + n > self.model.context_tokens:
            raise ValueError(f"{start + n} tokens do not fit the llama.cpp context of {self.model.context_tokens}: "
                             "load the model with a larger context_tokens")
        if positions is not None and len(positions) != n:
            raise ValueError(f"{len(positions)} positions for {n} tokens: give one position per token")
        rows = kept_rows(n, keep)
        if visible is None:
            positions = list(range(start, start + n)) if positions is None else [int(p) for p in positions]
            sequence_ids, causal = [[0]] * n, n
        else:
            if positions is None:
                raise ValueError("a masked forward needs the tokens' positions (the mask alone does not say them)")
            positions = [int(p) for p in positions]
            sequence_ids, causal, seen = self._sequences_for_mask(visible, positions)
        try:
            logits = self._decode(token_ids, positions, sequence_ids, rows)
        except BaseException:
            self._forget_new_cells(start)  # a failed decode may leave cells and copied prefixes behind
            raise
        self.length = start + n
        if visible is not None:
            self._causal_length = start + causal
        self._last_forward = (start, None if visible is None else seen)
        return logits

    def _decode(self, token_ids, positions: list[int], sequence_ids: list[list[int]], rows: list[int]) -> torch.Tensor:
        import llama_cpp

        for sequence in self._mask_sequences:
            llama_cpp.llama_memory_seq_cp(self.memory, 0, sequence, -1, -1)  # the prefix, seen by all
        n = len(token_ids)
        batch = self.model.batch(n)
        batch.n_tokens = n
        np.ctypeslib.as_array(batch.token, shape=(n,))[:] = token_ids
        np.ctypeslib.as_array(batch.pos, shape=(n,))[:] = positions
        counts = np.ctypeslib.as_array(batch.n_seq_id, shape=(n,))
        flags = np.ctypeslib.as_array(batch.logits, shape=(n,))
        flags[:] = 0
        flagged = sorted(set(rows))
        flags[flagged] = 1
        for i, ids in enumerate(sequence_ids):
            counts[i] = len(ids)
            for j, sequence in enumerate(ids):
                batch.seq_id[i][j] = sequence
        status = llama_cpp.llama_decode(self.model.context, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status} on {n} tokens at positions "
                               f"{positions[0]}..{positions[-1]} (1: no room in the KV cache; -1: a batch "
                               "llama.cpp refused, see its message above)")
        # llama_get_logits holds the flagged rows in batch order, once each; copy them out in the order asked
        pointer = llama_cpp.llama_get_logits(self.model.context)
        logits = np.ctypeslib.as_array(pointer, shape=(len(flagged), self.model.vocab_size))
        order = [flagged.index(row) for row in rows]
        return torch.from_numpy(logits[order])  # fancy indexing copies: the buffer is reused by the next decode

    def _forget_new_cells(self, start: int) -> None:
        """Back to the state before a forward that failed: no mask ids, nothing past `start`."""
        import llama_cpp

        for sequence in self._mask_sequences:
            llama_cpp.llama_memory_seq_rm(self.memory, sequence, -1, -1)
        llama_cpp.llama_memory_seq_rm(self.memory, 0, start, -1)
        self._mask_sequences, self._causal_length = [], None

    def _sequences_for_mask(self, visible: torch.Tensor, positions: list[int]
                            ) -> tuple[list[list[int]], int, list[list[bool]]]:
        """Sequence ids per token that give llama.cpp's mask the visibility of `visible`, the
        length of the leading causal run (tokens at consecutive positions that see exactly the
        tokens before them: they stay on sequence 0 and may stay in the cache), and the mask over
        the new tokens as lists (what `retain` reads)."""
        cached, n = self.length, len(positions)
        visible = visible.to(torch.bool).cpu()
        if tuple(visible.shape) != (n, cached + n):
            raise ValueError(f"the mask must be (queries, cache + queries) = ({n}, {cached + n}), "
                             f"got {tuple(visible.shape)}")
        if cached and not bool(visible[:, :cached].all()):
            raise ValueError("the llama.cpp backend needs every query to see the whole cache (sequence ids "
                             "express masks over the new tokens only)")
        new = visible[:, cached:]
        if bool(new.triu(1).any()):
            # llama.cpp writes a batch's cells chunk by chunk (n_ubatch): a query cannot see a later chunk
            raise ValueError("a query sees a token after it in the batch: order the tokens so that each query "
                             "comes after every token it sees")
        seen = new.tolist()  # plain lists: the checks below read single entries
        causal = 0
        while (causal < n and positions[causal] == cached + causal and all(seen[causal][:causal + 1])
               and all(seen[i][causal] for i in range(causal + 1, n))):
            causal += 1
        off_path = n - causal
        if off_path > MAX_SEQUENCES - 1:
            raise ValueError(f"a masked forward with {off_path} tokens off the causal path needs more than the "
                             f"{MAX_SEQUENCES - 1} sequence ids a llama.cpp context has here: verify fewer tokens")
        own = [0] * causal + list(range(1, off_path + 1))  # each query off the path: its own id
        sequence_ids = []
        for j in range(n):
            if not seen[j][j]:
                raise ValueError(f"query {j} does not see itself: llama.cpp's mask always shows a token its own cell")
            seen_by = [i for i in range(j + 1, n) if seen[i][j]]
            if any(positions[j] > positions[i] for i in seen_by):
                raise ValueError(f"token {j} at position {positions[j]} is visible to a query at an earlier "
                                 "position: llama.cpp hides cells after a query's position")
            sequence_ids.append([own[j], *(own[i] for i in seen_by if i >= causal)])
        for i in range(causal, n):  # llama.cpp wants each sequence's new positions to continue its cache
            reached = sorted({positions[j] for j in range(i + 1) if seen[i][j]})
            if reached[0] != cached or reached[-1] - reached[0] + 1 != len(reached):
                raise ValueError(f"query {i} sees positions {reached}: llama.cpp needs the positions a query sees "
                                 f"to run on from the cache ({cached}) without gaps")
        self._mask_sequences = own[causal:]
        return sequence_ids, causal, seen

    def retain(self, rows: Sequence[int]) -> None:
        """Keep the cache from before the last forward plus its `rows` (ascending): the forward's causal
        run, then at most one path that its last row sees whole (a token tree's accepted path). The
        path's cells join sequence 0 (a copy of the last row's sequence id, which every cell it sees
        carries); every other masked cell goes."""
        import llama_cpp

        if self._last_forward is None:
            raise ValueError("retain() keeps rows of the last forward, and there is none since the last crop")
        start, seen = self._last_forward
        rows = [int(row) for row in rows]
        causal = self.length - start if self._causal_length is None else self._causal_length - start
        prefix = [row for row in rows if row < causal]
        path = [row for row in rows if row >= causal]
        if prefix != list(range(len(prefix))) or (path and len(prefix) != causal):
            raise ValueError(f"retain() keeps a prefix of the forward's causal part ({causal} rows) and then one "
                             f"path, got rows {rows}")
        if not path:
            self.crop(start + len(prefix))
            return
        last = path[-1]
        if [row for row in range(causal, len(seen)) if seen[last][row]] != path:
            raise ValueError(f"rows {path} are not the path row {last} sees: retain() keeps one root-to-node path")
        llama_cpp.llama_memory_seq_cp(self.memory, last - causal + 1, 0, -1, -1)  # the path's cells join sequence 0
        for sequence in self._mask_sequences:
            llama_cpp.llama_memory_seq_rm(self.memory, sequence, -1, -1)
        self._mask_sequences, self._causal_length, self._last_forward = [], None, None
        self.length = start + len(rows)

    def crop(self, length: int) -> None:
        """Keep the first `length` tokens of the cache."""
        import llama_cpp

        self._last_forward = None
        if self.model.sequence_generation != self.generation:
            self._check_owner()
        if self._causal_length is not None:
            for sequence in self._mask_sequences:
                llama_cpp.llama_memory_seq_rm(self.memory, sequence, -1, -1)
            limit, self._causal_length, self._mask_sequences = self._causal_length, None, []
            if length > limit:
                llama_cpp.llama_memory_seq_rm(self.memory, 0, limit, -1)
                self.length = limit
                raise ValueError(f"after a masked forward the cache can keep its causal part only ({limit} tokens), "
                                 f"not {length}")
        if length < self.length:
            if not llama_cpp.llama_memory_seq_rm(self.memory, 0, length, -1):
                raise RuntimeError(f"llama.cpp could not crop its cache to {length} tokens")
            self.length = length
