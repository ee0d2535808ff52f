"""`stepserve bench`: a load client for any OpenAI-compatible server (streaming
/v1/completions), or the same arrivals through the in-process engine or the simulator."""
