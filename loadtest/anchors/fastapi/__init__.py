"""FastAPI + uvicorn services as users typically write them, one module per task."""
