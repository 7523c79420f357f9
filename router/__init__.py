"""slotgate's router: the HTTP proxy, fast backends, slow path, cache, settings and CLI."""
