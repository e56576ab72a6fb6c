"""LitServe (Lightning AI): LitAPI workers behind a uvicorn front end, with its own batching."""
