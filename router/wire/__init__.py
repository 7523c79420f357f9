"""Wire formats: request parsing and response rendering for each HTTP surface (OpenAI, System One)."""
