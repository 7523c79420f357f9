"""The System One surface: body decoding, request parsing, staged answers, and its route."""
