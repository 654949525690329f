"""The inference side: the reference engine, its HTTP server and client, stock vLLM behind the same contract.

- `engine`: the reference engine (pure torch + transformers)
- `sampling`: token sampling for decode and speculative verify
- `kv_cache`: the slot-based KV cache
- `shared_decode`: decoding identical histories once per step
- `speculation`: HistoSpec drafting
- `spec_metrics`: the `spec/*` metrics
- `server`: the HTTP server around one engine
- `client`: the async client of the inference contract
- `vllm_engine`: stock vLLM behind the contract
- `vllm_plugin`: vLLM plugin speaking Inflight's weight broadcast

May import: the stages below (`common` … `cluster`).
Run-time imports go only downwards (pyproject.toml `[tool.importlinter]`).
"""
