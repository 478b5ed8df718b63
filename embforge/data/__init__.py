"""Reading data: tables (CSV/TSV/JSONL/Parquet with file:line:column errors), retrieval folders (BEIR layout),
and the built-in data sets of ``../shared/data`` behind one registry (:mod:`embforge.data.builtin`)."""

from embforge.data.tables import DataError, Dataset, read_table

__all__ = ["DataError", "Dataset", "read_table"]
