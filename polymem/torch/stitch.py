"""The donor's site carried whole: its projection and gate frozen, read through a learned stitch.

A site learnt together with its table is what decodes the table's content; a fresh site learnt on other text
reads the same rows as domain statistics only. A stitched site keeps the donor's own site (projection, gate,
orders' scales) frozen and learns two linear maps between the residual streams at the site layers::

    h_d = W_in h_r                      # [B, T, d_d]  the recipient's hidden state in the donor's space
    y_d = donor_site(h_d, e, counts) - h_d     # the donor site's addition, on the rows the recipient's tokens read
    h_r ← h_r + W_out y_d               # [B, T, d_r]  back into the recipient (W_out starts at zero: step 0 is the
                                        #              model alone)

Only ``W_in`` and ``W_out`` train (on the recipient's text); with the donor's scalar gate the donor site ignores
``h_d``, so the stitch is ``W_out`` alone, a map from the donor's projected rows to the recipient's stream.

Not here: where it is used (the ``stitch`` arm, :mod:`polymem.recipes.pretrained`); saving a stitched site
(not supported: :meth:`polymem.torch.attach.AttachHandle.save` writes ordinary sites only).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from polymem.errors import PolymemError
from polymem.torch.site import MemorySite, SiteConfig


class StitchedSite(nn.Module):
    """A frozen donor site read from a recipient of width ``d_model`` (see the module docstring)."""

    def __init__(self, donor: MemorySite, d_model: int, *, seed: int = 0) -> None:
        super().__init__()
        d_d = donor.cfg.d_model
        self.cfg: SiteConfig = replace(donor.cfg, d_model=int(d_model))  # what the attach hook checks and reads
        self.donor = donor.requires_grad_(False)
        self.into = nn.Linear(int(d_model), d_d, bias=False)  # W_in [d_d, d_r]
        self.back = nn.Linear(d_d, int(d_model), bias=False)  # W_out [d_r, d_d]
        g = torch.Generator().manual_seed(int(seed))
        with torch.no_grad():
            nn.init.orthogonal_(self.into.weight, gain=math.sqrt(d_d / d_model), generator=g)
            self.back.weight.zero_()

    def forward(self, h: torch.Tensor, e: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
        hd = self.into(h.to(self.into.weight.dtype))  # [B, T, d_d]
        yd = self.donor(hd, e, counts) - hd  # [B, T, d_d]
        return h + self.back(yd).to(h.dtype)


def donor_sites(site_dir: str | Path, layout: Any, fingerprint: str) -> list[MemorySite]:
    """The donor's sites (in its layer order), frozen, from the folder ``polymem train --model`` wrote beside its
    asset; refused when they were trained with another table than ``fingerprint``."""
    from polymem.torch.sitefile import read_site

    header, tensors = read_site(site_dir)
    if header["table"]["fingerprint"] != fingerprint:
        raise PolymemError(f"{str(site_dir)!r} was trained with table {header['table']['fingerprint']}, the donor asset "
                           f"is {fingerprint}; pass the site written with that asset")
    cfg = SiteConfig(**{k: v for k, v in header["site"].items() if k in SiteConfig.__dataclass_fields__})
    out = []
    for name in header["layers"]:
        key = name.replace(".", "/")
        site = MemorySite(cfg, layout)
        sd = {k[len(f"sites.{key}."):]: v for k, v in tensors.items() if k.startswith(f"sites.{key}.")}
        site.load_state_dict(sd)
        out.append(site.requires_grad_(False))
    return out
