"""Connection: the Link object, its inbox, outbox and frame dispatch (src/link/connection/)."""
