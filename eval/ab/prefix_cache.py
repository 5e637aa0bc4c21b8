"""The server's prefix-cache hit rate during a bench run, from SGLang's own scheduler log.

Every prefill batch logs ``Prefill batch, #new-seq: S, #new-token: N, #cached-token: C, ...``: N prompt tokens
computed, C taken from the radix cache.  The hit rate of a run is sum(C) / sum(C + N) over the lines its server
wrote during the run (the log between two byte offsets, as ``decode_rate`` reads the decode lines), so stock
SGLang and our launcher are measured the same way, by SGLang's own accounting.  The window holds the run's
warm-up request too (before bench_serving's ``--flush-cache``): a cold prefill, the same on every arm.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Tuple

# "Prefill batch [123], ..." when SGLang logs forward iterations
PREFILL_LINE = re.compile(r"Prefill batch(?: \[\d+\])?, #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+)")


def prefill_lines(text: str) -> List[Tuple[int, int, int]]:
    """(new sequences, new tokens, cached tokens) of every scheduler ``Prefill batch`` line in ``text``."""
    return [(int(m.group(1)), int(m.group(2)), int(m.group(3))) for m in PREFILL_LINE.finditer(text)]


def hit_rate(log_text: str) -> Dict[str, Any]:
    """A run's cached and computed prompt tokens and the hit rate cached / (cached + computed); ``hit_rate`` None
    when the window has no prefill line (a server that does not log them, or nothing ran)."""
    lines = prefill_lines(log_text)
    new, cached = sum(x[1] for x in lines), sum(x[2] for x in lines)
    return {"prefill_lines": len(lines), "new_seqs": sum(x[0] for x in lines), "new_tokens": new,
            "cached_tokens": cached, "hit_rate": cached / (new + cached) if new + cached else None}
