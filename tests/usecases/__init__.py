"""Use-case tests: the request and attempt use cases on in-memory fakes, no I/O."""
