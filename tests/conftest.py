"""Shared test configuration: hypothesis profiles and paths to shared hardware data."""
import os
import pathlib

import pytest
from hypothesis import HealthCheck, settings

# "ci" is derandomized so a CI run is reproducible; "dev" explores new examples each run.
# Deadlines are off: the first call of a Numba kernel includes its compilation.
settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=200,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=200)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def tensor_core_dumps():
    """Folder of real Tensor Core samples (../shared/data/tensor_core_dumps); skip if absent."""
    folder = SHARED_DATA / "tensor_core_dumps"
    if not folder.is_dir():
        pytest.skip(f"hardware samples not found at {folder} (shared/ is not beside the checkout)")
    return folder
