"""How a name joins onto ROOT, a local path or a URI alike. Alone, below the layout, so that what joins
paths without needing the layout (Beam's image workers, through components/common/files.py) does not load
the settings models the layout imports."""
from __future__ import annotations

import posixpath


def join(base: str, *parts: str) -> str:
    """Joins path parts onto a local path or a URI without touching its scheme."""
    return posixpath.join(base.rstrip("/") if base != "/" else base, *parts)
