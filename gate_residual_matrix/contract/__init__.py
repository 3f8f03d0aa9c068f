"""The op contract: what an op author needs, and nothing that runs a matrix.

An op (``ops/<op>/``) builds its rows from these modules alone: :mod:`.base` (what an
implementation is), :mod:`.library` / :mod:`.versioned` / :mod:`.kernel_only` /
:mod:`.extension` (a library's own function, per version, loaded from its installed
distribution, its released wheel's files or its compiled extension), :mod:`.inputs`
(deterministic inputs), :mod:`.row_blocks` (outputs computed block by block),
:mod:`.timing` (median GPU or CPU time) and :mod:`.compare` (bitwise comparison and
accuracy figures). Nothing here imports ``runner`` or ``ops``.
"""
