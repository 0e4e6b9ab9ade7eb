"""Site files: what :meth:`AttachHandle.save` writes and :func:`read_site` reads back (for
:func:`polymem.torch.attach.load_attached`).

``site.json`` (format ``polymem.memory-site`` v1: sites' config, layers, tokenizer fingerprint, the table named by
fingerprint) and ``site.safetensors`` (site weights; the table when it was trained; the model when it was).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polymem.errors import FormatError, PolymemError

if TYPE_CHECKING:  # the handle is only annotated here; attach.py calls this module
    from polymem.torch.attach import AttachHandle

SITE_FORMAT = "polymem.memory-site"


def site_header(handle: AttachHandle) -> dict[str, Any]:
    t = handle.table
    return {
        "format": SITE_FORMAT, "version": 1, "train": handle.train,
        "freeze_model": bool(getattr(handle, "freeze_model", True)),
        "model": type(handle.model).__name__, "layers": list(handle.layer_names),
        "site": asdict(next(iter(handle.sites.values())).cfg),
        "tokenizer": handle.tokenizer_info,
        "table": {"fingerprint": t.fingerprint(), "hash_spec": t.spec.to_dict(), "layout": t.layout.to_dict(),
                  "orders": list(t.orders), "source": t.source, "saved": bool(t.trainable)},
    }


def save_site(handle: AttachHandle, path: str | os.PathLike[str]) -> Path:
    from safetensors.torch import save_file

    from polymem._io import atomic_path, atomic_write_json, ensure_parent

    d = Path(path)
    ensure_parent(d / "site.json")
    tensors = {f"sites.{k}": v.detach().cpu().contiguous() for k, v in handle.sites.state_dict().items()}
    if handle.table.trainable:
        tensors["table"] = handle.table.weight.detach().cpu().contiguous()
    if not getattr(handle, "freeze_model", True):
        tensors.update({f"model.{k}": v.detach().cpu().contiguous() for k, v in handle.model.state_dict().items()})
    header = site_header(handle)
    # each file lands whole; site.json goes last and names what site.safetensors must hold (checked on load)
    with atomic_path(d / "site.safetensors", fsync=True) as tmp:
        save_file(tensors, str(tmp))
    atomic_write_json(d / "site.json", header, indent=1, sort_keys=True, fsync=True)
    return d


def read_site(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``site.json``'s header, ``site.safetensors``' tensors) of a folder :func:`save_site` wrote; the format
    and version checked. :func:`polymem.torch.attach.load_attached` re-attaches them to a model."""
    from safetensors.torch import load_file

    d = Path(path)
    if not (d / "site.json").is_file():
        raise PolymemError(f"{str(d)!r} has no site.json; pass the folder written by handle.save(...)")
    try:
        header = json.loads((d / "site.json").read_text())
    except json.JSONDecodeError as e:
        raise FormatError(f"{str(d / 'site.json')!r} is not valid JSON ({e})") from None
    if header.get("format") != SITE_FORMAT or header.get("version") != 1:
        raise FormatError(f"{str(d)!r} holds format {header.get('format')!r} v{header.get('version')!r}; this polymem reads {SITE_FORMAT!r} v1")
    tensors = load_file(str(d / "site.safetensors"))
    return header, tensors
