"""The real-model executor: a Llama-family decoder with a paged KV cache, its weights
float (safetensors) or in the GGUF's own Q4_1/Q8_0 groups on our C kernels, and the
runner that executes a SchedulerOutput on it. Nothing is imported here, so
`import stepserve.model` stays torch-free."""
