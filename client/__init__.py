"""What talks to Triton from outside it: the gRPC facade, the tritonclient scripts and the one Triton admin client."""
