"""``import polymem`` stays light: numba, torch and zarr load only when a feature needs them; old names still
work for one release, with a DeprecationWarning."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("numba", "torch", "zarr", "transformers", "matplotlib", "tensorstore", "tiktoken", "sentencepiece",
         "tokenizers")


def loaded_after(code: str) -> list[str]:
    """The heavy top-level modules in sys.modules after running ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_polymem_loads_no_heavy_dependency() -> None:
    assert loaded_after("import polymem; polymem.__version__; polymem.PolymemError") == []


def test_spec_and_layout_stay_light_and_the_cli_starts_without_torch_numba_zarr() -> None:
    assert loaded_after("import polymem; polymem.HashSpec(); polymem.Layout(pages=4)") == []
    assert loaded_after("import polymem.cli.app") == []


@pytest.mark.slow
def test_the_probe_sees_what_a_feature_loads() -> None:
    """The check above can fail: using the numba kernels or a torch site does load them."""
    got = loaded_after("import numpy as np, polymem; polymem.Layout(pages=4).rows(np.zeros(3, dtype=np.uint64))")
    assert got == ["numba"]
    assert "torch" in loaded_after("import polymem; polymem.attach")


@pytest.mark.parametrize("old,new", [("TokenCache", "TokenHashes")])
def test_deprecated_names_warn_and_resolve(old: str, new: str) -> None:
    import polymem

    with pytest.warns(DeprecationWarning, match=f"polymem.{old} is deprecated; use polymem.{new}"):
        assert getattr(polymem, old) is getattr(polymem, new)


@pytest.mark.parametrize("old,new", [("TorchTokenCache", "TorchTokenHashes"), ("HashTable", "TrainableTable")])
def test_deprecated_torch_names_warn_and_resolve(old: str, new: str) -> None:
    import polymem.torch

    with pytest.warns(DeprecationWarning, match=old):
        assert getattr(polymem.torch, old) is getattr(polymem.torch, new)
