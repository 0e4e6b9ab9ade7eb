"""Asset operations: assets as portable artifacts (docs/asset-ops.md). Torch-free.

* :func:`convert` (:mod:`.convert`): a tokenizer-bound table (``--hash xor``, Engram's form: :mod:`.engram`)
  re-addressed by bytes, replaying a corpus;
* :func:`subset` (:mod:`.subset`): a sparse copy holding the pages a corpus touches;
* :func:`merge` (:mod:`.merge`): donors of one hash spec and layout combined, weighted by their row counts;
* :func:`pull` (:mod:`.pull`): a remote asset staged on local disk, verified.

A stage above the asset format (they open and write assets through :mod:`polymem.asset`) and below
``engines/`` (whose :func:`polymem.engines.convert.convert_engine` re-addresses imported engine tables).
The functions share their modules' names: ``polymem.ops.convert`` is the function (its module is
``sys.modules['polymem.ops.convert']``; import names from it with ``from polymem.ops.convert import ...``).
"""

from __future__ import annotations

from polymem.ops.convert import convert
from polymem.ops.merge import merge
from polymem.ops.pull import pull
from polymem.ops.subset import subset

__all__ = ["convert", "merge", "pull", "subset"]
