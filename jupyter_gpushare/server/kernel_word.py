"""What a kernel says of itself before a park: its word, asked in the kernel (``_gpushare_wait.parkable``).

A parked kernel must be able to hear that it is, and every demand on it must be one it can say (a cell, a comm
message). So a kernel without its pipes to the server is not parked, nor one that runs a thread its notebook started
or a child process (a demo's web server, a served model: their GPU calls come from no cell), nor one that does not
answer. Nor, by hand as by the line, one that imported a framework not in park_frameworks (the kernel says which).
What the kernel answers is untrusted: a kernel that lies keeps only itself from parking, or hangs itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from .services import KernelStarts

PARKABLE_ASK_S = 10.0  # how long a kernel has to say whether it may be parked (an idle one: milliseconds)


async def why_not_parked(starts: KernelStarts, kernel_id: str, frameworks: Sequence[str]) -> str | None:
    """Why the kernel may not be parked now, in its own words (at most 300 characters), or None."""
    if not starts.hears(kernel_id):
        return "it has no pipe to the server, so it could not say that it is wanted"
    allowed = repr(tuple(str(f) for f in frameworks))  # (the admin's list: quoted by repr)
    said = await starts.ask(kernel_id, f"__import__('_gpushare_wait').parkable({allowed})", PARKABLE_ASK_S)
    why = (said or "").strip(chr(39) + chr(34))[:300]
    if not why:
        return "it did not say whether it may be parked (a cell runs, or it does not answer)"
    return None if why == "ok" else why
