"""`stepserve bench`: a load client for any OpenAI-compatible server (streaming
/v1/completions), or the same arrivals through the in-process engine or the simulator.

    client.py    one streamed request -> RequestRecord (send time, chunk times, usage)
    loadgen.py   open-loop (Poisson / gamma / constant) and closed-loop issue of a workload
    slo.py       goodput SLOs: "ttft:500 tpot:50 e2el:2000" (milliseconds)
    results.py   metrics from records with vLLM's definitions; JSON, CSV, Markdown writers
    scrape.py    sample a target's /metrics during a run (stepserve, vLLM, SGLang, TGI names)
    inprocess.py the same workload through LLMEngine (--engine) or the simulator (--sim)
    workload_options.py  the request list from BenchWorkloadOptions (scenario, file, random lengths)
    job.py       BenchOptions and run_bench: one run, printed and written (`stepserve bench`)
"""
