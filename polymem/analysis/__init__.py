"""Read-only studies of tokenizers, corpora and tables: ``coverage`` (cross-tokenizer byte-equivalent n-gram
coverage), ``iosim`` (page reads under a cache), ``crosscheck`` (byte-equal n-grams hash alike)."""
