"""The NATS bridge: unmodified JetStream pull clients take jobs from the broker.

`protocol` is the pure wire grammar (no I/O); `engine` runs the pull request life cycle of a
JetStream consumer over the claim and ack use cases; `leaf` speaks the leafnode protocol;
`bridge` wires the transports (client-only or hybrid) to the engine.
"""
