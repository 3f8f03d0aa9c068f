"""Our gate_residual kernels: numba.cuda on the GPU (:mod:`kernels.gate_residual`) and the same
algorithm with numba on the CPU (:mod:`kernels.gate_residual_cpu`)."""
