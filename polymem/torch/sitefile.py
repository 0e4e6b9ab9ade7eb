"""Site files: what :meth:`AttachHandle.save` writes and :func:`load_attached` reads back.

``site.json`` (format ``polymem.memory-site`` v1: sites' config, layers, tokenizer fingerprint, the table named by
fingerprint) and ``site.safetensors`` (site weights; the table when it was trained; the model when it was).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch.nn as nn

from polymem.errors import FormatError, PolymemError, SpecMismatchError
from polymem.hash.layout import Layout
from polymem.hash.spec import HashSpec
from polymem.torch.attach import AttachHandle, _check_usable, _resolve_table, attach
from polymem.torch.tables import TrainableTable

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


def load_attached(
    model: nn.Module, path: str | os.PathLike[str], table_or_asset: Any = None, tokenizer: Any = None, **kw: Any
) -> AttachHandle:
    """Re-attach what :meth:`AttachHandle.save` wrote. ``table_or_asset`` is needed when the table was frozen
    (it is named by fingerprint, not stored); a table with another fingerprint, spec or layout is refused."""
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
    th = header["table"]
    spec, layout = HashSpec.from_dict(th["hash_spec"]), Layout.from_dict(th["layout"])
    if "table" in tensors:
        table: Any = TrainableTable(tensors.pop("table"), spec=spec, layout=layout, orders=tuple(th["orders"]))
    elif table_or_asset is None:
        raise PolymemError(
            f"{str(d)!r} was saved with a frozen table (fingerprint {th['fingerprint']}, source {th['source']}); "
            "pass that asset as table_or_asset"
        )
    else:
        table = _resolve_table(table_or_asset, spec, kw.get("in_memory", True), trainable=False)
        _check_usable(table.spec, table.layout, where="table")
        if table.spec != spec or table.layout != layout:
            raise SpecMismatchError(
                f"the saved site expects layout {layout.to_dict()} and hash base {th['hash_spec'].get('base')}, the "
                f"given table has layout {table.layout.to_dict()} and base {table.spec.to_dict().get('base')}; pass "
                f"the asset the site was trained with (fingerprint {th['fingerprint']})"
            )
        if table.fingerprint() != th["fingerprint"]:
            raise SpecMismatchError(
                f"the given table has fingerprint {table.fingerprint()}, the saved site was trained with "
                f"{th['fingerprint']} ({th['source']}); pass that asset"
            )
    site = header["site"]
    tok = tokenizer if tokenizer is not None else header["tokenizer"]["name"]
    handle = attach(
        model, table, tok, layers=header["layers"], train=header["train"], max_n=site["max_n"], gate=site["gate"],
        gate_init=site["gate_init"], conv=site["conv"], init_seed=site["init_seed"],
        freeze_model=header.get("freeze_model"), value_init=site.get("value_init", "orthogonal"),
    )
    if handle.tokenizer_info["fingerprint"] != header["tokenizer"]["fingerprint"]:
        handle.detach()
        raise SpecMismatchError(
            f"tokenizer fingerprint {handle.tokenizer_info['fingerprint']} ({handle.tokenizer_info['name']}) differs "
            f"from the saved site's {header['tokenizer']['fingerprint']} ({header['tokenizer']['name']}); pass that tokenizer"
        )
    sd = {k[len("sites."):]: v for k, v in tensors.items() if k.startswith("sites.")}
    handle.sites.load_state_dict(sd)
    md = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    if md:
        model.load_state_dict(md)
    return handle
