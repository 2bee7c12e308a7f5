"""Peak memory while a piece of code runs: CUDA max allocated, or the CPU process's peak RSS."""

from __future__ import annotations

import ctypes
import gc
import os
import threading
from contextlib import contextmanager

import torch

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


class PeakMemory:
    """Context manager: `.peak_bytes` after exit is the peak memory while the block ran *above
    what the process held when it started* (CPU: resident set size; CUDA: allocated bytes).

    Freed heap memory is returned first (malloc_trim), so what earlier work left in the allocator
    neither hides nor inflates this block's peak. ru_maxrss is the peak of the whole process
    lifetime, useless per call, so on CPU a daemon thread samples RSS every `interval_s`.
    Do not nest two of these on CUDA: the inner one resets the device's peak counter.
    """

    def __init__(self, device: torch.device | str = "cpu", interval_s: float = 0.01):
        self.device = torch.device(device)
        self.interval_s = interval_s
        self.start_bytes = 0
        self.peak_bytes = 0
        self._highest = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "PeakMemory":
        trim_heap()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_bytes = int(torch.cuda.memory_allocated(self.device))
        else:
            self.start_bytes = self._highest = rss_bytes()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._highest = max(self._highest, rss_bytes())

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._highest = int(torch.cuda.max_memory_allocated(self.device))
        else:
            self._stop.set()
            self._thread.join()
            self._highest = max(self._highest, rss_bytes())
        self.peak_bytes = max(self._highest - self.start_bytes, 0)


def kv_cache_bytes(cache) -> int:
    """Bytes held by a transformers cache object's key and value tensors."""
    total = 0
    for layer in getattr(cache, "layers", []):
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
    return total


def memory_now(device: torch.device | str = "cpu") -> int:
    """What the process holds now: RSS on CPU, allocated bytes on CUDA (the same kinds of number
    `PeakMemory` reports, so a peak minus this is what came on top)."""
    if torch.device(device).type == "cuda":
        return int(torch.cuda.memory_allocated())
    return rss_bytes()


def trim_heap() -> None:
    """Return freed heap memory to the system: glibc keeps it in the process (and in its RSS) until
    malloc_trim. Cheap enough to run before every measured sample."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        pass


def free_memory() -> None:
    """Everything freed goes back, reference cycles included (a full gc pass costs ~0.2 s with a model
    loaded: for between-model steps, not for every sample)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    trim_heap()


@contextmanager
def gc_frozen():
    """Python's cyclic garbage collector with everything that exists now (the loaded models, their modules and
    tensors) left out of its passes while the block runs, then put back (a frozen reference cycle is never freed).
    A full pass over a loaded model takes ~0.2 s, and it runs when allocations cross a threshold: inside whichever
    timed generation crossed it. Suffix decoding allocates thousands of tree nodes a request, so in 02 (AMX Xeon,
    nineteenth session) the method timed first after such allocations paid ~35 ms a code request more than the same
    steps timed second, 3% of a request. vLLM freezes its startup objects the same way."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
