"""The I/O-free core: the flow of one call and the operations it yields, the stored
envelope, keys, options, serializers, signing, events, who waits on which channel,
the near cache's store and this process's flights. Nothing here talks to Redis."""
