"""Shared fixtures: the pagoda CLI the API is compared with, and one model loaded for the module."""
import os
import shutil

import pytest

# torch before pagoda: a CUDA build of pagoda links the system's NCCL, and torch's CUDA library,
# loaded after it, binds to that NCCL instead of its own and fails to load (undefined symbol
# ncclCommResume), which would skip every GPU test as "no torch".
try:
    import torch  # noqa: F401
except ImportError:
    pass


@pytest.fixture(scope="session")
def pagoda_binary():
    path = os.environ.get("PAGODA_BINARY") or shutil.which("pagoda")
    if not path or not os.path.exists(path):
        pytest.fail("set PAGODA_BINARY to the pagoda CLI (ctest does)")
    return path
