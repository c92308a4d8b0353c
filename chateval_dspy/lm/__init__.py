"""LM plumbing, entered once at the edge: the offline switches (``offline``), ``resolve_lm`` (``resolve``: embedded
server, base URL or LiteLLM string), the OpenAI-compatible engine (``engine``) and the JSON adapter (``adapter``).

Import the module you need: this package's ``__init__`` imports nothing, so a light module such as
``chateval_dspy.lm.offline`` loads without DSPy or the OpenAI client.
"""
