"""gate-residual-matrix: a reproducibility matrix runner for GPU kernels, in one import
package so that its parts never clash with PyPI's ``runner``, ``kernels`` or ``ops``.

* :mod:`gate_residual_matrix.runner`: the matrix runner (``python -m gate_residual_matrix``, or
  ``gate-residual-matrix``: ``matrix``, ``report``, ``compare``, ...);
* :mod:`gate_residual_matrix.kernels`: our kernels (numba.cuda, and their CPU twins);
* :mod:`gate_residual_matrix.ops`: the ops, their specs and implementations.

Importing this package imports none of them (no torch, no numba).
"""
