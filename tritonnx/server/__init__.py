"""Server operations: tritonserver, its supervisor and the facade as child processes, model versions.

The paths they use, scratch repositories and the whole serving stack are here too. Nothing here runs
inside Triton's Python stub, and the stub never imports it.
"""
