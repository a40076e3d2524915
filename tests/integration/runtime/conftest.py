"""Example models written once per session for the runtime's integration tests."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kiln_runtime.examples import write_example

ModelFactory = Callable[..., Path]


@pytest.fixture(scope="session")
def example_model(tmp_path_factory: pytest.TempPathFactory) -> ModelFactory:
    """``example_model(kind, **config_sections)`` -> a directory with model.pt + config.json."""
    written: dict[str, Path] = {}

    def make(kind: str, **sections: dict[str, Any]) -> Path:
        if kind not in written:
            written[kind] = tmp_path_factory.mktemp(f"{kind}-model")
            write_example(kind, written[kind])
        if not sections:
            return written[kind]
        variant = tmp_path_factory.mktemp(f"{kind}-variant")
        (variant / "model.pt").symlink_to(written[kind] / "model.pt")
        document = json.loads((written[kind] / "config.json").read_text())
        for key, value in sections.items():
            document[key] = {**document.get(key, {}), **value}
        (variant / "config.json").write_text(json.dumps(document))
        return variant

    return make
