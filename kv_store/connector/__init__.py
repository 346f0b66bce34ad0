"""vLLM's side of the store: a KV connector (`OmniKvConnector`) and the per-process agent it uses."""
