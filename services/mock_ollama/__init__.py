"""A mock Ollama server: /api/generate and /api/chat streaming NDJSON with realistic timings."""
