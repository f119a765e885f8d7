"""The memos of a search."""

from __future__ import annotations

PROCESS_MEMO_SIZE = 1024  # entries per process memo (a replay's requests meet a few hundred lists)


def process_memo(kinds, network, name: str, max_entries: int = PROCESS_MEMO_SIZE) -> dict:
    """A dict that lives as long as ``kinds`` (one model's, see ``kinds.shared_kind_cache``) for
    ``network``, for what planning calls one after the other can share; emptied when full."""
    key = ("process memo", name)
    hit = kinds.extras.get(key)
    if hit is None or hit[0] is not network:
        hit = kinds.extras[key] = (network, {})
    memo = hit[1]
    if len(memo) >= max_entries:
        memo.clear()
    return memo
