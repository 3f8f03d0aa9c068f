"""Stage 1: the matrix file, read and validated into frozen, typed objects (:mod:`.matrix`),
with the path options and the main job's list of matrix files."""
