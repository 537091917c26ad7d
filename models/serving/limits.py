"""The request-size limits of ``anychip serve``: plain numbers, importable by its ``--help``
without the web stack."""

MIN_MAX_BODY_BYTES = 64 << 10  # --max-body-bytes' default never goes below it
BODY_BYTES_PER_TOKEN = 32      # ASCII text is ~4 bytes a token, JSON-escaped emoji ~12, an id list ~7


def default_max_body_bytes(max_len: int) -> int:
    """A body cap that fits a whole ``max_len``-token request in any text, with room to spare, and
    no more: the tokenizer holds the event loop while it reads a prompt (~1 s a MiB)."""
    return max(MIN_MAX_BODY_BYTES, BODY_BYTES_PER_TOKEN * max_len)
