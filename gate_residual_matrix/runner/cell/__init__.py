"""Stage 4: one cell in this process: its rows (:mod:`.catalog`), cases, comparisons,
accuracy, batch invariance and timings, and its report (:mod:`.run`)."""
