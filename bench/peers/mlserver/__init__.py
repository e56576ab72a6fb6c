"""MLServer (Seldon): KServe v2 REST and gRPC, adaptive batching, a pool of parallel inference workers."""
