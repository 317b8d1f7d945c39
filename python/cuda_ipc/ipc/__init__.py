"""IPC: descriptors, imports of legacy handles, pools and events, the mapping cache (src/ipc/)."""
