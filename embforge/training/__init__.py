"""Training: the run description (config, stages), tasks (rows -> embeddings -> loss), sampling and task weights,
the loop (:mod:`embforge.training.loop`), checkpoints, and the hard-negative refresher."""
