"""What the host machine gives the engine: its cores, who else runs on them, the threads a
step gets and the CPU step budget. No torch at import: a runner's threads and hardware are
read inside the functions that set them."""
