"""Onto a GPU host without network: build an install set here (bundle), install it there (host)."""
