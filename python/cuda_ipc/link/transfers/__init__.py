"""Transfers: the handlers of host and device memory (src/link/transfers/)."""
