"""The benchmark: an op's implementations timed as peers on one GPU (CUDA events,
interleaved rounds, medians), against the copy-bandwidth floor of the bytes the op must move."""
