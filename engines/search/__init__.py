"""The ``search`` engine: a tantivy full-text index per store partition, fault tolerant through a
changelog of ``doc_id -> document JSON`` records. See docs/search.md."""

from localstate.engines.search.engine import InvalidQueryError, SearchEngine, SearchEngineFactory, SearchHit
from localstate.engines.search.schema import FIELD_TYPES, TOKENIZERS, FieldSpec

__all__ = ["SearchEngineFactory", "SearchEngine", "SearchHit", "InvalidQueryError", "FieldSpec",
           "FIELD_TYPES", "TOKENIZERS"]
