"""LLM serving monitor: a measuring proxy in front of Ollama, server polls (Ollama, vLLM), a bounded probe."""
