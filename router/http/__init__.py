"""HTTP surfaces: the app factory, admission guard, rate limit, ops routes, and one package per wire protocol."""
