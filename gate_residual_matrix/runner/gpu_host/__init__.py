"""Everything this project runs on a GPU host, as named steps: ``python -m gate_residual_matrix
gpu-host`` (README, "On a GPU machine").

* :mod:`.command`: the options, checked before anything runs;
* :mod:`.stamp`: the source stamp, for a copy of the tree without git;
* :mod:`.steps`: the step runner (a log per step, ``steps.json``, the deadline);
* :mod:`.procedure`: the steps; :mod:`.modes`, the one that runs the cells;
* :mod:`.probes`: what the steps run in child processes.
"""
