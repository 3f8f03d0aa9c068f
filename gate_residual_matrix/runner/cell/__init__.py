"""Stage 4: one cell in this process: its rows (:mod:`.catalog`), cases, comparisons,
accuracy, batch invariance and timings, and its report (:mod:`.run`); what a person sees while
cells run: progress (:mod:`.progress`), the heartbeat (:mod:`.heartbeat`) and the whole job's
time left (:mod:`.job_clock`)."""
