"""What the page service and its numba kernels share: the named slots of their state arrays.

The service keeps the cache's bookkeeping in small int64 arrays so that compiled code (:mod:`._kernels`) can
update it in place: ``state`` (``STATE_SIZE`` slots, named ``S_*``) and ``kst`` (``KST_SIZE`` counters, named
``K_*``, folded into :meth:`PageService.stats`). Both sides index them with the names below, defined only here.
This module imports no numba (the kernels load on first use: :func:`._load.kernels`).

The kernels read these integers as compile-time constants; numba's on-disk cache is keyed on the kernels' own
source file, so a change of a value here needs a touch of ``_kernels.py`` too (or ``NUMBA_CACHE_DIR`` cleared).
"""

from __future__ import annotations

# ``state``: the cache's slots, and what the lane's first call reports back
S_TOP = 0  # slots [0, top) of the slab have been used
S_NFREE = 1  # free slots on the stack ``free[:nfree]``
S_CACHED = 2  # chunks in the cache now
S_PEAK = 3  # the most chunks cached at once
S_MISSES = 4  # lane_begin: distinct chunks of the forward not in the cache
S_READ_HERE = 5  # lane_begin: of those, read in the caller's thread
S_SHARD = 6  # lane_begin returned -2: the shard it needs open
S_HITS = 7  # lane_begin: slots of the forward's hits, in mhit[:hits]
S_DECODED = 8  # lane_begin: 1 when it decoded the rows too
STATE_SIZE = 9

# ``kst``: counters the compiled lane adds to (stats() adds them to the Python ones of the same name)
K_HITS, K_MISSES, K_READS, K_NOWAIT, K_CALLS, K_BYTES, K_LANE = range(7)
KST_SIZE = 7
KST_STATS = (("hits", K_HITS), ("misses", K_MISSES), ("reads", K_READS), ("nowait_reads", K_NOWAIT),
             ("read_calls", K_CALLS), ("bytes_read", K_BYTES))  # stats() key of each counter (K_LANE: lane_forwards)

READING = -2  # chunk_at[slot] while a read is landing in the slot (not in the index yet, never evicted)

# stored dtypes the kernels decode (rows_from_cache); others take the general path
CODE_NF4, CODE_FLOAT16, CODE_BFLOAT16, CODE_FLOAT32 = range(4)
DTYPE_CODES = {"nf4": CODE_NF4, "float16": CODE_FLOAT16, "bfloat16": CODE_BFLOAT16, "float32": CODE_FLOAT32}
