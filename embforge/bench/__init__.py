"""Reproducible experiments run by ``embforge bench <experiment>`` (see :mod:`embforge.bench.cosent_vs_ce`)."""
