"""Every debate an MLflow trace: one judged item becomes one trace that reads like the debate itself.

``spans`` builds the item's span tree from its results record after it was judged (``timing``: when each span ran),
``emitter`` sends a tree to MLflow with every text scrubbed of secrets (``chateval_dspy.scrub``), ``tracer`` traces a
batch's items and never raises into it, and ``rule`` says when a run is traced by default. Each trace is tagged
``chateval.item_id`` (and ``chateval.run_key``, ``chateval.task``, ``chateval.model`` and what the caller adds).
"""

import chateval_dspy.lazy as lazy

# Names are imported on first use (``chateval_dspy.lazy``): the rule and its help text load without MLflow or DSPy,
# for the ``chateval`` parser.
__getattr__, __dir__ = lazy.exports(__name__, {
    **dict.fromkeys(("dumps", "emit", "trace_record"), "chateval_dspy.run.tracing.emitter"),
    **dict.fromkeys(("DEFAULT_MAX_ITEMS", "TRACE_HELP", "at_most_lines", "tracing_default"), "chateval_dspy.run.tracing.rule"),
    **dict.fromkeys(("CUT_MARK", "MAX_TRACE_TEXT", "ROOT_ATTRIBUTE", "ROOT_PREFIX", "config_summary", "debate_span",
                     "debate_tree", "preference_name", "root_name", "span_names", "was_cut"), "chateval_dspy.run.tracing.spans"),
    **dict.fromkeys(("FLUSH_EVERY", "Tracer"), "chateval_dspy.run.tracing.tracer"),
})

__all__ = ["CUT_MARK", "DEFAULT_MAX_ITEMS", "FLUSH_EVERY", "MAX_TRACE_TEXT", "ROOT_ATTRIBUTE", "ROOT_PREFIX",
           "TRACE_HELP", "Tracer", "at_most_lines", "config_summary", "debate_span", "debate_tree", "dumps", "emit",
           "preference_name", "root_name", "span_names", "trace_record", "tracing_default", "was_cut"]
