"""Stand-in servers for the fast backends' remote APIs (System One, vLLM), answering from a real
BANKING77 model so that tests and benchmarks exercise real request/response paths offline."""
