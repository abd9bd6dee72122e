"""KV-cache handoff between prefill and decode workers (NIXL)."""
