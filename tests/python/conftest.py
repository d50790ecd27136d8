"""Shared fixtures: the pagoda CLI the API is compared with, and one model loaded for the module."""
import os
import shutil

import pytest


@pytest.fixture(scope="session")
def pagoda_binary():
    path = os.environ.get("PAGODA_BINARY") or shutil.which("pagoda")
    if not path or not os.path.exists(path):
        pytest.fail("set PAGODA_BINARY to the pagoda CLI (ctest does)")
    return path
