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
