"""Candidate forms measured not to pay, kept to be measured again: each may import shipped code,
shipped code never imports them."""
