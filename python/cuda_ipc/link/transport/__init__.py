"""Transport: frames, Unix sockets and paths, TCP auth, large messages (src/link/transport/)."""
