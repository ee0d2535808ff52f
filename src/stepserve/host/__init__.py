"""What the host machine gives the engine: its cores, who else runs on them, the threads a
step gets, the CPU step budget, and the readings of it that the engine, the server's
/metrics, the doctor and bench read (CpuReading, and CpuShare between two of them).

    cpu_share.py       what Linux says: the process's run-queue wait and time on a CPU,
                       the others' CPU, usable cores, who else is runnable; a bench run's
                       fields (CpuWatch)
    step_threads.py    the threads each step runs on (StepThreads), the canary that asks
                       whether one more would get a core
    step_budget.py     scheduling defaults from the hardware: the CPU step budget
    step_reference.py  steps' time over their shapes' quiet time
    cpu_metrics.py     the readings on /metrics, and read back from two scraped pages

No torch here at import: a runner's thread count and hardware are read inside the
functions that set them."""
