"""Stage 2: the matrix expanded into cells, a selection of them, and whether they fit."""
