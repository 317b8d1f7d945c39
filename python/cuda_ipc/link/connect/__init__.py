"""Connect: spawn, listen, connect (src/link/connect/)."""
