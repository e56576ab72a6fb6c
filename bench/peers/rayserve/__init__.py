"""Ray Serve: deployment replicas as Ray actors behind its HTTP proxy, batching with @serve.batch."""
