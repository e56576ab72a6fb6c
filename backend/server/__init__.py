"""Server operations: everything that runs outside Triton's Python stub.

tritonserver, its supervisor and the facade as child processes, the admin key, the paths they
use, scratch repositories and the whole serving stack.

Nothing here runs inside Triton's Python stub, and the stub never imports it: the stub side is
the rest of `backend` (the model adapter and what it calls).
"""
