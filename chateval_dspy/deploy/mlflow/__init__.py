"""The evaluator in MLflow: a GenAI judge and scorer, a pyfunc model, traces and the labels read back from them."""
