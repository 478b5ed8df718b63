"""Static embeddings: a token-embedding table averaged per text (model2vec / sentence-transformers
``StaticEmbedding``). :mod:`embforge.static.model` is the model, :mod:`embforge.static.distill` makes one from a
transformer through the ``model2vec`` library (``pip install 'embforge[static]'``)."""
