"""MkDocs hook (mkdocs.yml ``hooks:``): Sphinx roles in docstrings render as plain code.

Docstrings cross-reference with Sphinx roles (:func:`decode_image`).
mkdocstrings leaves the role's name in the text; this drops it.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):(?=<code>)")


def on_page_content(html: str, **kwargs: Any) -> str:
    """Remove ``:role:`` before inline code in a rendered page."""
    return _ROLE.sub("", html)
