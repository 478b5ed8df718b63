"""Model merging on state dicts: the methods' records (:mod:`~embforge.merging.records`), their coefficient
functions (:mod:`~embforge.merging.methods`, mergekit's definitions) and the weight-by-weight merge
(:mod:`~embforge.merging.state`). Loading folders of any model kind, checking that their settings agree and saving
the result is :mod:`embforge.merge`."""
