"""BentoML 1.4: a @bentoml.service class with HTTP APIs, served by worker processes."""
