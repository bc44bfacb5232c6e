"""Fixtures of the training tests."""

import shutil

import pytest


@pytest.fixture
def copy_of(tmp_path):
    """``copy_of(folder)``: a private copy of a (module-scoped) checkpoint folder that a test may damage or extend."""

    def copy(folder: str) -> str:
        target = str(tmp_path / "copy")
        shutil.copytree(folder, target)
        return target

    return copy
