"""Engine settings and the user's inputs: their bounds, files, sizes, URLs and the
usage-error type every layer raises."""
