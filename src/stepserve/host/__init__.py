"""What the host machine gives the engine: its cores, who else runs on them, the threads a
step gets, the CPU step budget, and the readings of CPU sharing that the engine, the
server's /metrics, the doctor and bench read (CpuReading; CpuShare between two). No torch
at import: a runner's threads and hardware are read inside the functions that set them.

    cpu_share.py       what Linux says: CpuShareSampler, CpuReading, CpuShare, CpuWatch
    step_threads.py    the threads each step runs on (StepThreads) and its Canary
    step_budget.py     the CPU step budget: scheduling defaults from the hardware
    step_reference.py  steps' time over their shapes' quiet time
    cpu_metrics.py     the readings on /metrics, and read back from two scraped pages
"""
