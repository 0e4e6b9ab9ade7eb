"""Site files: what :meth:`AttachHandle.save` writes and :func:`read_site` reads back (for
:func:`polymem.torch.attach.load_attached`).

``site.json`` (format ``polymem.memory-site`` v1: sites' config, layers, tokenizer fingerprint, the table named by
fingerprint and path) and ``site.safetensors`` (site weights; the table when it was trained; the model when it was).

A frozen table's path is written relative to the site folder when the table sits inside it or beside it
(``../donor.pmem``), so the two move together; :func:`find_table` resolves it (and old absolute paths, and a
table found inside or beside a moved site). A *bundle* (:func:`bundle_site`) is a site folder that holds its table
(``table.pmem`` or ``table.safetensors``) and a ``README.md`` card: one folder to copy, push or pull.
"""

from __future__ import annotations

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
    src = header["table"].get("source")
    if isinstance(src, dict) and isinstance(src.get("path"), str) and src["path"]:
        header["table"]["source"] = {**src, "path": relative_table_path(src["path"], d)}
    # each file lands whole; site.json goes last and names what site.safetensors must hold (checked on load)
    with atomic_path(d / "site.safetensors", fsync=True) as tmp:
        save_file(tensors, str(tmp))
    reader = getattr(handle, "byte_reader", None)
    if reader is not None:  # next bytes: the decoder's file, and its record (polymem.torch.bytesite)
        header["next_bytes"] = reader.save(d)
    atomic_write_json(d / "site.json", header, indent=1, sort_keys=True, fsync=True)
    return d


def relative_table_path(table: str, site_dir: str | os.PathLike[str]) -> str:
    """``table`` as site.json records it: relative to the site folder (POSIX separators) when the table sits inside
    it or beside it, else absolute; URLs as given.

    >>> relative_table_path("/data/runs/donor.pmem", "/data/runs/donor.pmem.site")
    '../donor.pmem'
    >>> relative_table_path("/data/other/donor.pmem", "/data/runs/x.site")
    '/data/other/donor.pmem'
    """
    from polymem._paths import is_url

    if is_url(table):
        return table
    given = Path(os.path.normpath(Path(table).absolute()))
    d = Path(site_dir).resolve()
    for t in (given, Path(table).resolve()):  # as given, then with links resolved (the site's are)
        if t.parent == d.parent:
            return f"../{t.name}"
        if d in t.parents:
            return t.relative_to(d).as_posix()
    return str(given)


BUNDLED_TABLES = ("table.pmem", "table.safetensors")  # where a bundle keeps its table


def find_table(site_dir: str | os.PathLike[str], header: dict[str, Any], *, fix: str = "pass table_or_asset=TABLE") -> str | None:
    """The table a saved site reads: None when site.safetensors holds it (a trained table); else the path site.json
    records (relative to the site folder, or absolute, or a URL); where that does not exist, a table inside the
    site folder (a bundle's ``table.pmem``) or beside it with the recorded name. A table found nowhere is one
    error naming what was looked for and ``fix`` (the CLI passes its ``--asset``/``--table`` option)."""
    from polymem._paths import is_url
    from polymem.errors import MissingError

    d = Path(site_dir)
    th: dict[str, Any] = header["table"] if isinstance(header.get("table"), dict) else {}
    if th.get("saved"):
        return None
    src = th.get("source")
    rec = src.get("path") if isinstance(src, dict) else None
    if rec is not None and not (isinstance(rec, str) and rec):
        raise FormatError(f"{str(d)!r}: site.json names the table path {rec!r}; expected a non-empty string (the "
                          f"table asset's path); {fix}")
    if rec and is_url(rec):
        return rec
    tried: list[Path] = []
    if rec:
        p = Path(rec)
        tried.append(p if p.is_absolute() else d / p)
    tried += [d / n for n in BUNDLED_TABLES]
    if rec:
        tried += [d / Path(rec).name, d.parent / Path(rec).name]
    for c in tried:
        if _table_exists(c):
            return str(c)
    what = (f"its table {rec!r} is not there, nor inside the site folder (table.pmem, {Path(rec).name!r}) nor beside "
            f"it") if rec else "names no table path and holds no table.pmem"
    raise MissingError(f"{str(d)!r}: {what}; {fix} (the asset the site was trained with, fingerprint "
                       f"{str(th.get('fingerprint'))[:16]}…)")


def _table_exists(p: Path) -> bool:
    return p.is_dir() or p.is_file() or (p.suffix != ".safetensors" and p.with_suffix(".safetensors").is_file())


def read_site(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``site.json``'s header, ``site.safetensors``' tensors) of a folder :func:`save_site` wrote; the format
    and version checked. :func:`polymem.torch.attach.load_attached` re-attaches them to a model."""
    from safetensors.torch import load_file

    from polymem._io import load_regular_safetensors, read_json

    d = Path(path)
    f = d / "site.json"
    if not os.path.lexists(f):
        raise PolymemError(f"{str(d)!r} has no site.json; pass the folder written by handle.save(...)")
    header = read_json(f, what="site header", fix="pass the folder written by handle.save(...)")
    if not isinstance(header, dict) or header.get("format") != SITE_FORMAT or header.get("version") != 1:
        got = (header.get("format"), header.get("version")) if isinstance(header, dict) else (type(header).__name__, None)
        raise FormatError(f"{str(d)!r} holds format {got[0]!r} v{got[1]!r}; this polymem reads {SITE_FORMAT!r} v1")
    check_header(header, str(f))
    try:
        tensors = load_regular_safetensors(d / "site.safetensors", what="site weights", load=load_file,
                                           fix="the site is damaged: save it again")
    except PolymemError:
        raise
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types (and OSError); all mean the same
        raise FormatError(f"{str(d / 'site.safetensors')!r} is not a readable safetensors file ({type(e).__name__}); "
                          "the site is damaged: save it again") from None
    return header, tensors


def site_schema() -> Any:
    """The declared schema of the ``site.json`` fields attaching reads (:mod:`polymem._schema`)."""
    from polymem._schema import AnyOf, Const, Int, ListOf, Num, Obj, Str

    obj = Obj({})  # an object: hash_spec and layout are checked by their own parsers
    return Obj({
        "train": Const(("projection", "table", "all")),
        "layers": ListOf(AnyOf((Str(256), Int())), max_len=4096, min_len=1),
        "site": Obj({"max_n": Int(0), "init_seed": Int(0), "gate_init": Num(), "gate": Str(64),
                     "conv": Const((True, False))}),
        "table": Obj({"orders": ListOf(Int(), max_len=64), "fingerprint": Str(256), "hash_spec": obj, "layout": obj}),
        "tokenizer": Obj({"fingerprint": Str(256)}),
    })


def check_header(h: dict[str, Any], where: str) -> None:
    """Every field of ``site.json`` that attaching reads fits :func:`site_schema` (one FormatError naming it)."""
    from polymem._schema import validate

    validate(h, site_schema(), where=where, fix="the file was edited or is damaged: save the site again")
