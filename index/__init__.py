"""Retrieval over page summaries: which KV pages attention should stream in.

Knows vectors and page ids only; never imports tieredkv, paging, transformers or torch.
"""

from .errors import IndexStaleError
from .page_index import PageIndex
from .scoring import quest_bound
from .summary import SUMMARY_METHODS, max_summary_vectors, summarize

__all__ = ["SUMMARY_METHODS", "IndexStaleError", "PageIndex", "max_summary_vectors",
           "quest_bound", "summarize"]
