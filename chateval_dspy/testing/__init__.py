"""Test doubles that run DSPy's real adapter: a scripted LM engine and an OpenAI-compatible fake server."""
