"""Messages: encoding and decoding, transfer handlers, NCCL records and aborts (src/link/messages/)."""
