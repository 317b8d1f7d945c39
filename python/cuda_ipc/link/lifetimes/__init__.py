"""Lifetimes: leases and GONE notices (src/link/lifetimes/)."""
