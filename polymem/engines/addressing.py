"""An engine's token-id addressing as data: re-exported from :mod:`polymem.hash.engine_addressing`.

The addressing lives with the other hash specs because an imported engine table's header holds it and the asset
format (a lower stage than ``engines/``) parses and validates it when the asset opens.
"""

from __future__ import annotations

from polymem.hash.engine_addressing import (ADDRESSING_FORMAT, ADDRESSING_VERSION, ID_MAP_ENCODING, INT64_MAX,
                                            EngineAddressing, LayerTable, decode_id_map, encode_id_map,
                                            parse_addressing)

__all__ = ["ADDRESSING_FORMAT", "ADDRESSING_VERSION", "ID_MAP_ENCODING", "INT64_MAX", "EngineAddressing", "LayerTable",
           "decode_id_map", "encode_id_map", "parse_addressing"]
