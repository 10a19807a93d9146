"""End to end through `vllm serve`: one fresh server per arm, measured by vLLM's own
`vllm bench serve` client, and the identity of its sampled tokens and logprobs over HTTP
(tests/gpu/vllm/engine.sh serve; bench/serve/README.md)."""
