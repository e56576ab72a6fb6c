"""What several tritonnx processes share: the settings mechanism, the ports, the admin key's header, tracing's settings.

Imports nothing else of tritonnx, so every process can use it.
"""
