import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests import the shared tiny-model builders from tiny.py


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run in a millisecond on one thread; a second thread only adds waiting on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- tiny model folders: `models.load` runs its real path (bitsandbytes and torch.ao included) ----------

@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from tiny import save_tiny_model

    return {"target": save_tiny_model(tmp_path_factory.mktemp("target"), 0),
            "draft": save_tiny_model(tmp_path_factory.mktemp("draft"), 1)}


@pytest.fixture(scope="module")
def load(folders):
    """Loaded variants, cached per (role, quantization, dtype) for the module."""
    from specdec_lab.experiments import quantized

    cache = {}

    def get(role: str, name: str, dtype: str = "float32"):
        key = (role, name, dtype)
        if key not in cache:
            cache[key] = quantized.load_variant(folders[role], name, dtype, "cpu")
        return cache[key]
    return get
