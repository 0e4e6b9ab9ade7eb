"""Bundles: one folder that holds a saved site, its table and a README card, so it can be copied, pushed to any
fsspec URL (a bucket, a model hub's file system) and pulled back with nothing else to pass.

    FOLDER/site.json           the site (its table path: table.pmem or table.safetensors, relative)
    FOLDER/site.safetensors    the site's weights
    FOLDER/bytes.safetensors   the byte reader's decoder, when the site has one (polymem.torch.bytesite)
    FOLDER/table.pmem/         the frozen table (an asset copied with every shard's sha256 checked), or
    FOLDER/table.safetensors   a table file
    FOLDER/README.md           the card: the model, tokenizer and fingerprint, the table, corpus and scores

A bundle is a site folder: ``polymem eval --site FOLDER``, ``polymem generate --site FOLDER`` and
``AttachHandle.from_pretrained(model, FOLDER)`` take it as it is. :func:`push` and :func:`pull_site` copy a bundle
(or a plain site folder) to and from an fsspec URL, each file's sha256 compared with the source's. Not here: the
site's maths (:mod:`polymem.torch.site`) and its files' format (:mod:`polymem.torch.sitefile`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from polymem.errors import FormatError, MissingError, PolymemError
from polymem.torch.sitefile import BUNDLED_TABLES, find_table, read_site, save_site

__all__ = ["bundle_site", "card_text", "pull_site", "push", "save_bundle"]

_SITE_FILES = ("site.json", "site.safetensors")


def bundle_site(site: str | os.PathLike[str], out: str | os.PathLike[str], *, table: str | None = None,
                overwrite: bool = False, scores: dict[str, Any] | None = None) -> Path:
    """Write the bundle ``out`` for the saved site ``site``: its files, its table (``table``, else the one the
    site names: :func:`find_table`) copied and checked, and a README card (``scores`` adds lines to it). Built in a
    hidden sibling of ``out`` and renamed into place whole."""
    from polymem._paths import is_url

    src, out = Path(site), Path(out)
    if is_url(os.fspath(out)):
        raise PolymemError(f"a bundle is written to a local folder; {str(out)!r} is a URL — bundle locally, then "
                           "`polymem push FOLDER URL`")
    header, _ = read_site(src)
    if out.absolute() == src.absolute():
        raise PolymemError(f"the bundle {str(out)!r} is the site itself; pick another folder (-o)")
    if out.exists() and not overwrite:
        raise PolymemError(f"{str(out)!r} exists; pass --overwrite (overwrite=True) or another folder")
    tpath = table if table is not None else find_table(src, header, fix="pass --asset TABLE")
    stage = out.with_name(f".{out.name}.bundle-{os.getpid()}")
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    try:
        shutil.copyfile(src / "site.safetensors", stage / "site.safetensors")
        if header.get("next_bytes") is not None:  # the byte reader's decoder (polymem.torch.bytesite)
            from polymem.torch.bytehead import BYTES_FILE

            shutil.copyfile(src / BYTES_FILE, stage / BYTES_FILE)
        provenance: dict[str, Any] = {}
        if tpath is not None:
            name, provenance = _copy_table(tpath, stage)
            header["table"]["source"] = {**(header["table"].get("source") or {}), "kind": "asset", "path": name}
        from polymem._io import atomic_write_json, atomic_write_text

        atomic_write_json(stage / "site.json", header, indent=1, sort_keys=True, fsync=True)
        atomic_write_text(stage / "README.md", card_text(header, provenance, scores))
        if out.exists():
            trash = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(trash)
            stage.rename(out)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            stage.rename(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return out


def save_bundle(handle: Any, path: str | os.PathLike[str]) -> Path:
    """:meth:`AttachHandle.save` with ``bundle=True``: the site saved to a hidden sibling, a frozen table held only
    in memory written there from its rows (``table.safetensors``), then :func:`bundle_site` into ``path``."""
    out = Path(path)
    tmp = out.with_name(f".{out.name}.site-{os.getpid()}")
    try:
        save_site(handle, tmp)
        if not handle.table.trainable and not _table_found(tmp):
            from polymem.torch.tablefile import save_table

            save_table(tmp / BUNDLED_TABLES[1], handle.table.to_numpy(), handle.table.spec, handle.table.layout,
                       orders=tuple(handle.table.orders))
        return bundle_site(tmp, out, overwrite=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _table_found(site: Path) -> bool:
    try:
        return find_table(site, read_site(site)[0]) is not None
    except MissingError:
        return False


def _copy_table(tpath: str, stage: Path) -> tuple[str, dict[str, Any]]:
    """Copy the table into the staged bundle: an asset through :func:`polymem.ops.pull.pull` (every shard's sha256
    checked), a table file as it is (its header read back). Returns (its name in the bundle, its provenance)."""
    from polymem.torch.tablefile import open_table

    t = open_table(tpath)
    p = Path(str(getattr(t, "path", tpath)))
    if p.suffix == ".safetensors" and p.is_file():
        shutil.copyfile(p, stage / BUNDLED_TABLES[1])
        open_table(stage / BUNDLED_TABLES[1])  # the copy reads back (header and tensor shapes checked)
        return BUNDLED_TABLES[1], dict(getattr(t, "provenance", {}) or {})
    from polymem.ops.pull import pull

    copied = pull(tpath, stage / BUNDLED_TABLES[0])
    return BUNDLED_TABLES[0], dict(copied.provenance or {})


def card_text(header: dict[str, Any], provenance: dict[str, Any], scores: dict[str, Any] | None = None) -> str:
    """The bundle's README.md: what the site is for, what its table is, where it came from and how it scored."""
    tok = header.get("tokenizer") or {}
    th = header.get("table") or {}
    lay = th.get("layout") or {}
    site = header.get("site") or {}
    pm = provenance.get("model")
    table_model = pm.get("name") if isinstance(pm, dict) else pm
    rows = [
        ("model (architecture)", header.get("model")),
        ("tokenizer", f"{tok.get('name')} (fingerprint `{tok.get('fingerprint')}`)"),
        ("site", f"before blocks {', '.join(map(str, header.get('layers') or []))}; gate {site.get('gate')}, "
                 f"orders 1..{site.get('max_n')}"),
        ("table", f"`{(th.get('source') or {}).get('path', 'in site.safetensors')}`, fingerprint `{th.get('fingerprint')}`, "
                  f"{lay.get('num_rows', '?')} rows × {lay.get('head_dim', '?')}"),
        ("table trained with", table_model),
        ("table's tokenizer", (provenance.get("tokenizer") or {}).get("fingerprint")
         if isinstance(provenance.get("tokenizer"), dict) else None),
        ("corpus", provenance.get("corpus")),
        ("held-out split", f"every {provenance['heldout_every']}th document" if provenance.get("heldout_every") else None),
        ("tokens seen", provenance.get("tokens_seen")),
        ("held-out bits per byte in the table's training run, with the table", provenance.get("heldout_bpb")),
        ("held-out bits per byte in the table's training run, table off", provenance.get("heldout_bpb_memory_off")),
        ("held-out bytes scored in that run", provenance.get("heldout_scored_bytes")),
    ] + [(str(k), v) for k, v in (scores or {}).items()]
    lines = ["# polymem memory site", "",
             "A memory site (projection and gate) and the byte-addressed n-gram table it reads, for the model below. "
             "The numbers under *table* come from the table's provenance (the run that trained it).", "",
             "| | |", "|---|---|"]
    lines += [f"| {k} | {_cell(v)} |" for k, v in rows if v is not None]
    lines += ["", "## Use", "", "```bash", "polymem eval --model MODEL --site THIS_FOLDER --corpus TEXT",
              "polymem generate --model MODEL --site THIS_FOLDER --prompt 'def main('", "```", "", "```python",
              "from polymem import AttachHandle", "handle = AttachHandle.from_pretrained(model, \"THIS_FOLDER\")",
              "```", "", "Made by `polymem bundle` (or `handle.save(FOLDER, bundle=True)`); `polymem push` / "
              "`polymem pull` copy it to and from any fsspec URL.", ""]
    return "\n".join(lines)


def _cell(v: Any) -> str:
    s = f"{v:.4f}" if isinstance(v, float) else str(v)
    return s.replace("|", "\\|").replace("\n", " ")


# -------------------------------------------------------------------------------------------- push and pull
def _files_of(folder: Path) -> list[str]:
    """The bundle's or site's files, as relative POSIX keys (links refused: a bundle holds its own files)."""
    keys = []
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            raise FormatError(f"{str(p)!r} is a symbolic link; a bundle holds only its own files")
        if p.is_file():
            keys.append(p.relative_to(folder).as_posix())
    return keys


def _sha(f: Any) -> str:
    h = hashlib.sha256()
    while chunk := f.read(1 << 22):
        h.update(chunk)
    return h.hexdigest()


MANIFEST = "polymem-files.json"  # key -> sha256 of every other file, written last by push


def push(folder: str | os.PathLike[str], url: str, *, storage_options: dict[str, Any] | None = None,
         overwrite: bool = False) -> int:
    """Copy a site or bundle folder to an fsspec URL (``s3://``, ``memory://``, ``file://``, ``hf://`` with
    huggingface_hub installed, …): each file, then a manifest of their sha256 (``polymem-files.json``), then
    each file is read back and compared. Returns the number of files."""
    import fsspec

    d = Path(folder)
    if not (d / "site.json").is_file():
        raise PolymemError(f"{str(d)!r} has no site.json; push takes a site or bundle folder (polymem bundle SITE -o FOLDER)")
    read_site(d)
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    root = root.rstrip("/")
    if fs.exists(f"{root}/site.json") and not overwrite:
        raise PolymemError(f"{url!r} already holds a site; pass --overwrite (overwrite=True) or another URL")
    sums: dict[str, str] = {}
    for key in _files_of(d):
        with open(d / key, "rb") as f:
            sums[key] = _sha(f)
        fs.makedirs(f"{root}/{key}".rsplit("/", 1)[0], exist_ok=True)
        fs.put_file(str(d / key), f"{root}/{key}")
    with fs.open(f"{root}/{MANIFEST}", "wb") as f:
        f.write(json.dumps(sums, indent=1, sort_keys=True).encode())
    for key, want in sums.items():
        with fs.open(f"{root}/{key}", "rb") as f:
            if _sha(f) != want:
                raise FormatError(f"{url}/{key}: the copy's sha256 differs from the local file's; push again")
    return len(sums)


def pull_site(url: str, dest: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None,
              overwrite: bool = False) -> Path:
    """Copy a site or bundle from an fsspec URL to the local folder ``dest``: every file the source's manifest
    names (``polymem-files.json``, written by :func:`push`; without it, every file below the URL), each sha256
    checked while it streams; then the copy is read as a site and renamed into place whole."""
    import fsspec

    from polymem.asset._fs import check_key

    out = Path(dest)
    if out.exists() and not overwrite:
        raise PolymemError(f"{str(out)!r} already exists; pass --overwrite or pick another directory")
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    root = root.rstrip("/")
    if not fs.exists(f"{root}/site.json"):
        raise PolymemError(f"{url!r} holds no site.json; pull takes a site or bundle (or an asset: a folder with zarr.json)")
    sums: dict[str, str] | None = None
    if fs.exists(f"{root}/{MANIFEST}"):
        with fs.open(f"{root}/{MANIFEST}", "rb") as f:
            try:
                sums = json.loads(f.read())
            except ValueError:
                sums = None
        if not isinstance(sums, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in sums.items()):
            raise FormatError(f"{url}/{MANIFEST} is not a map of file names to sha256; push the bundle again")
    keys = sorted(sums) if sums is not None else sorted(
        str(p)[len(root) + 1:] for p in fs.find(root) if str(p).startswith(root + "/"))
    keys = [check_key(k, f"{url}: object") for k in keys if k != MANIFEST]
    stage = out.with_name(f".{out.name}.pull-{os.getpid()}")
    if stage.exists():
        shutil.rmtree(stage)
    try:
        for key in keys:
            target = stage / key
            target.parent.mkdir(parents=True, exist_ok=True)
            h = hashlib.sha256()
            with fs.open(f"{root}/{key}", "rb") as src, open(target, "wb") as dst:
                while chunk := src.read(1 << 22):
                    h.update(chunk)
                    dst.write(chunk)
                dst.flush()
                os.fsync(dst.fileno())
            if sums is not None and h.hexdigest() != sums[key]:
                raise FormatError(f"{url}/{key}: sha256 {h.hexdigest()[:12]}… differs from the manifest's "
                                  f"{sums[key][:12]}…: the source is damaged or changed while it was copied; nothing "
                                  "was written — push it again")
        read_site(stage)
        if sums is None and (stage / BUNDLED_TABLES[0]).is_dir():  # no manifest: the asset's own checksums
            from polymem.asset import MemoryAsset

            MemoryAsset.open(stage / BUNDLED_TABLES[0]).verify()
        if out.exists():
            shutil.rmtree(out)
        stage.rename(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return out
