"""Files whose version changed but whose content did not (`touch`, a re-upload of the same bytes):
not new, so not published again. A listed file counts as unchanged when a published span holds its
URI at the same size and the span's content index gives its SHA-256 as the file's own; only such
candidates (beam_jobs/compare.py finds them while it merges) are looked up, streaming each span's
content index and keeping only their lines, and read, in the driver, before the Beam job. Nothing is recorded for them, so a later
run reads them again; that costs one read of each touched file, not a span of copies."""
from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor

from beam_jobs.local import canonical, open_source
from beam_jobs.sources import Source
from components.common.content_index import parse
from components.common.spans import Spans
from components.common.trusted_index import verified
from components.contracts.layout import Root

BLOCK = 1 << 20


def without_unchanged(fresh: list[Source], touched: list[Source], root: Root) -> tuple[list[Source], int]:
    """`fresh` less the files whose content a published span already holds under their URI, and
    how many those were; `touched` are the files of `fresh` that a span holds at their size."""
    candidates = {canonical(s.uri): s for s in touched}
    published = _published_hashes(candidates, root) if candidates else {}
    with ThreadPoolExecutor(max_workers=8) as pool:
        digests = list(pool.map(lambda name: _digest(candidates[name].uri + candidates[name].query), published))
    same = {name for name, digest in zip(published, digests) if digest == published[name]}
    return [s for s in fresh if canonical(s.uri) not in same], len(same)


def _published_hashes(candidates: dict, root: Root) -> dict[str, str]:
    """SHA-256 of each candidate's published record, from the spans' content indexes (checked as
    they stream, rebuilt where broken: components/common/trusted_index.py)."""
    def scan(lines) -> dict[str, str]:
        found = {}
        for number in Spans(root).published():
            for line in lines(number):
                sha, _, _, _, source = parse(line)
                name = canonical(source)
                if name in candidates:
                    found[name] = sha
        return found

    return verified(root, scan)


def _digest(uri: str) -> str | None:
    try:
        with open_source(uri) as f:
            digest = hashlib.sha256()
            while block := f.read(BLOCK):
                digest.update(block)
            return digest.hexdigest()
    except Exception:  # gone, unreadable, no longer a regular file: the Beam job reports it
        return None
