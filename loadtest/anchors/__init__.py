"""The alternatives the benches compare against: FastAPI apps and in-process limits per task, llama.cpp and ONNX Runtime GenAI."""
