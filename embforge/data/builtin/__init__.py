"""Loaders for the offline data sets under ``../shared/data`` (see :func:`embforge.data.paths.data_root`).

One small module per data set turns its original files into :class:`embforge.data.tables.Dataset` objects with standard
column names (or, for retrieval, a BEIR-style corpus/queries/qrels triple).
"""
