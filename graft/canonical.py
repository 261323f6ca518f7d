"""One canonical form of text for every comparison that decides leakage, duplicates and blankness.

Two strings a reader cannot tell apart must compare equal: Unicode NFKC (full-width digits, ligatures and the
non-breaking space become their plain forms), format characters removed (category Cf: zero-width space and joiners,
the byte-order mark, soft hyphen, bidi marks), whitespace runs folded to one space and trimmed, and case folded.
What a model is trained on or graded against is never rewritten: this form is only ever compared.
"""
from __future__ import annotations

import unicodedata


def canonical_text(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    return " ".join(text.split()).casefold()


def is_blank(text: str) -> bool:
    """Nothing a reader can see: empty, whitespace, or only format characters."""
    return not canonical_text(text)
