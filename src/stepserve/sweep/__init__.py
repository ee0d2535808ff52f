"""Config sweeps, knee finding and reports: `stepserve sweep` and `stepserve report`."""
