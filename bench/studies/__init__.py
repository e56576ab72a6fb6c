"""Studies: claims of the documentation measured apart from the make targets (README.md here).

`python -m bench.studies.images` stays (the container tier runs it); the removed studies' reports keep their figures.
"""
