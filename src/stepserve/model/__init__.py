"""The real-model executor: a Llama-family decoder with a paged KV cache.

Map (nothing is imported here, so `import stepserve.model` stays torch-free):
    model_args.py      ModelArgs from a Hugging Face config.json (Llama, Mistral, Qwen2)
    rope.py            rotary embeddings with checkpoint scaling (linear, llama3)
    llama.py           the decoder over a ragged, flattened batch
    paged_attention.py attention metadata and batched attention over paged K/V
    kv_store.py        KV tensors, the CPU swap pool, sizing from a memory budget
    weights.py         safetensors loading into the fused layout
    gguf_file.py       a GGUF read in one pass: metadata, tensors, their values or groups
    gguf_convert.py    one-time GGUF -> safetensors conversion (the default model)
    gguf_weights.py    the GGUF packed once into our layout; a model with quantised layers
    quant.py           GGUF Q4_1/Q8_0 matrices and the linear layers on them
    ggml_kernels.py    loads ggml_kernels.c and the files beside it: matmuls on GGUF groups
    kernel_abi.py      the kernels' interface (kernel_abi.h) and the pointer checks
    kernel_cache.py    building the library into the cache; loading only our own
    fused_decode.py    a decode-only step's layers in one C call (decode_kernels.c)
    huge_pages.py      the quantised weights in one arena of 2 MB pages
    omp.py             freeing a thread's OpenMP workers before another thread steps
    modes.py           quantization x dtype: which mode "auto" picks, weight bytes
    agreement.py       greedy agreement of one weight mode with another
    tiny.py            the random-weight "tiny" preset
    presets.py         model names, the cache directory, resolve_model / list_models
    tokenizer.py       tokenizer.json + chat template + streaming detokenizer
    sampler.py         batched greedy / temperature / top-k / top-p / seeded sampling
    runner.py          TorchRunner.execute(SchedulerOutput) -> RunnerOutput
    step_timing.py     a runner's step timed on synthetic batches (benchmarks, profile/)
"""
