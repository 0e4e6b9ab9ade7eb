"""The raw-bytes tokenizer: 256 ids, id = byte value of the text's UTF-8 encoding.

It is the reference every other tokenizer is compared with: always byte-faithful, no special tokens,
no dummy prefix. What it does not do: add BOS/EOS or any ids above 255.
"""

from __future__ import annotations

import numpy as np

from polymem.tokenizers.base import Tokenizer


class BytesTokenizer(Tokenizer):
    """`encode("hé") == [104, 195, 169]`; `token_bytes(i) == bytes([i])`."""

    def __init__(self) -> None:
        super().__init__(name="bytes", family="bytes", vocab_size=256, dummy_prefix=False, lossy=False)

    def _encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def _compute_all_token_bytes(self) -> list[bytes | None]:
        return [bytes([i]) for i in range(256)]
