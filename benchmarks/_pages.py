"""Writing benchmark pages that carry a hand-written reading of their numbers."""

from __future__ import annotations

from pathlib import Path

#: The heading of the hand-written section a regenerated page keeps.
WRITTEN_HEADING = "## What this run shows"


def write_page(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, keeping the old page's hand-written section.

    The section starts at :data:`WRITTEN_HEADING` and runs to the end of the page; a rerun
    regenerates the tables above it, and the section should then be reread against them.
    """
    path = Path(path)
    if path.exists():
        old = path.read_text()
        at = old.find(WRITTEN_HEADING)
        if at >= 0 and WRITTEN_HEADING not in text:
            text = text.rstrip("\n") + "\n\n" + old[at:]
    path.write_text(text)
